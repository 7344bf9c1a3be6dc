"""Orbax checkpoints: bitwise restore into shardings; a kill -9 mid-write is never resumed."""

import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rollx import checkpoint
from rollx.parallel import mesh as mesh_lib
from rollx.trainer.step import Trainer
from tests.conftest import ROOT
from tests.parallel.test_sharding import CFG, initial_params, make_batch, policy_loss, worker


def test_restore_is_bitwise_and_keeps_shardings(tmp_path):
  w = worker(fsdp=2, tp=2)
  mesh = mesh_lib.make_mesh(w.strategy_args, devices=jax.devices()[:4])
  trainer = Trainer(CFG, w, mesh, policy_loss, total_steps=10)
  state = trainer.init_state(initial_params("lm"))
  batch = trainer.batch_sharding({k: jnp.asarray(v) for k, v in make_batch().items()})
  state, _ = trainer.update(state, batch, jax.random.PRNGKey(0))
  rng = jax.random.PRNGKey(7)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(1, {"actor": state, "rng": {"key": rng}}, {"step": 1, "kl_coef": 0.123})
  abstract = {"actor": checkpoint.abstract_of(state, trainer.state_shardings),
              "rng": {"key": jax.ShapeDtypeStruct(rng.shape, rng.dtype)}}
  restored, meta = checkpoint.Checkpointer(str(tmp_path / "checkpoints")).restore(1, abstract)
  assert meta == {"step": 1, "kl_coef": 0.123}
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(restored["actor"])[0],
                          jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a.sharding == b.sharding, path
  np.testing.assert_array_equal(np.asarray(restored["rng"]["key"]), np.asarray(rng))
  # and training continues identically from the restored state
  s1, m1 = trainer.update(state, batch, jax.random.PRNGKey(1))
  s2, m2 = trainer.update(restored["actor"], batch, jax.random.PRNGKey(1))
  assert float(m1["loss"]) == float(m2["loss"])


WRITER = r"""
import sys, numpy as np
from rollx import checkpoint
ckpt = checkpoint.Checkpointer(sys.argv[1])
ckpt.save(1, {"w": {"a": np.arange(10, dtype=np.float32)}}, {"step": 1})
print("saved 1", flush=True)
big = {"w": {"a": np.random.default_rng(0).normal(size=(64, 1024, 1024)).astype(np.float32)}}
while True:  # keep writing step 2.. until killed
  ckpt.save(2, big, {"step": 2})
"""


def test_kill_9_during_a_checkpoint_write_resumes_from_the_last_complete_one(tmp_path):
  directory = str(tmp_path / "checkpoints")
  proc = subprocess.Popen([sys.executable, "-c", WRITER, directory], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().startswith("saved 1")
  deadline = time.time() + 120
  while time.time() < deadline and not any("2" in d and d != "1" for d in os.listdir(directory)):
    time.sleep(0.01)  # the step-2 write has started (a temporary directory exists)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  assert checkpoint.resolve_resume("true", str(tmp_path)) == (directory, 1)
  restored, meta = checkpoint.Checkpointer(directory).restore(
      1, {"w": {"a": jax.ShapeDtypeStruct((10,), jnp.float32)}})
  np.testing.assert_array_equal(restored["w"]["a"], np.arange(10, dtype=np.float32))


def test_resolve_resume_values(tmp_path):
  assert checkpoint.resolve_resume("", str(tmp_path)) is None
  assert checkpoint.resolve_resume("false", str(tmp_path)) is None
  assert checkpoint.resolve_resume("true", str(tmp_path)) is None  # nothing saved yet
  with pytest.raises(FileNotFoundError, match="no such directory"):
    checkpoint.resolve_resume(str(tmp_path / "nope"), str(tmp_path))
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(5, {"x": {"a": np.ones(2, np.float32)}}, {"step": 5})
  assert checkpoint.resolve_resume(str(tmp_path / "checkpoints"), "/elsewhere") == (
      str(tmp_path / "checkpoints"), 5)
  assert checkpoint.resolve_resume(str(tmp_path / "checkpoints" / "5"), "/x") == (
      str(tmp_path / "checkpoints"), 5)
