"""Resume at the pipeline level: kill -9 mid-write and mid-training, resume from the last
complete checkpoint; the restore is bitwise and training continues the curve.

One chain of three real runs (local Ray cluster, JetStream server actor, Orbax), shared
by the tests below, on the tiny config of test_pipeline with a checkpoint every step and
LoRA adapters on (rollx.models.lora):

  A  `python -m rollx.train`, killed -9 while checkpoint 2 is being written: the
     ROLLX_HOLD_CHECKPOINT hook (rollx/checkpoint.py) stops that save after everything
     is in Orbax's temporary directory, before the commit, and says so on stdout.
  B  the AgenticPipeline built in a script with resume_from_checkpoint=true: it dumps
     what it restored (from checkpoint 1), trains on, and is killed -9 as soon as
     checkpoint 2 is complete, i.e. during the next step (the hook holds checkpoint 3, so
     the last complete one is 2 however late the kill lands).
  C  `python -m rollx.train` with resume_from_checkpoint=true: from checkpoint 2 to
     max_steps.

Every run gets a process session of its own and a marker in its environment (inherited
by the Ray daemons and actors it starts); a kill is `killpg` of the run, and then no
process may carry the marker any more. The runs share a JAX compilation cache: B and C
load what A compiled (about 10 s each on 2 cores).
"""

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rollx import checkpoint
from tests.conftest import ROOT
from tests.test_pipeline import SMALL, tb_scalars, train_env, train_flags

pytestmark = pytest.mark.timeout(900)  # the chain runs in the first test's setup

MAX_STEPS = 3
LORA_RANK = 4
INIT_KL_COEF, TARGET_KL, KL_HORIZON = 0.1, 0.01, 100
EPISODES = int(next(f for f in SMALL if "rollout_batch_size" in f).split("=")[1])  # KL ctrl n
EXTRA = [
    f"--config.max_steps={MAX_STEPS}", "--config.save_steps=1",
    # an adaptive KL-in-reward controller, so kl_coef moves every step
    "--config.use_kl_loss=False", f"--config.init_kl_coef={INIT_KL_COEF}",
    "--config.drop_zero_advantage_samples=False",  # a reward penalty: no zero advantages
    f"--config.target_kl={TARGET_KL}", f"--config.kl_horizon={KL_HORIZON}",
    # weights synced on even steps only: resuming at step 1 must push the restored ones
    "--config.actor_train.model_update_frequency=2",
    # still warming up at the end, so the logged lr shows where the schedule is
    "--config.actor_train.training_args.warmup_steps=10",
    # short episodes: rollouts are not what this is about
    "--config.custom_envs.FrozenLake.env_config.max_steps=3",
    # LoRA adapters on a frozen base: checkpoints hold both and the adapters' optimizer
    # state, syncs send the adapters alone, the KL reference is the base, the export
    # writes a PEFT directory beside the folded model
    f"--config.actor_train.model_args.lora.rank={LORA_RANK}",
]
WAIT_S = 400  # generous bound for one run to reach a point; never reached when healthy

# B: the pipeline as rollx.train builds it, plus a dump of what it restored.
RESUME_PROBE = r"""
import json, pickle, sys
from absl import logging
import jax, numpy as np, ray
from rollx import cli
dump = sys.argv.pop(1)
cli.parse_flags(sys.argv)
logging.set_verbosity(logging.WARNING)
from rollx.pipeline import AgenticPipeline
p = AgenticPipeline(cli.load_config())
leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(p.learner.actor_state))[0]
with open(dump + ".pkl", "wb") as f:
  pickle.dump({"actor": {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves},
               "rng": np.asarray(jax.device_get(p.learner.rng))}, f)
with open(dump + ".json", "w") as f:
  json.dump({"step": p.step, "kl_coef": p.learner.kl_ctrl.coef,
             "train_streams": p.train_rollout.stream_state(),
             "val_streams": p.val_rollout.stream_state(),
             "server_versions": p.servers.versions()}, f)
p.run()
"""


# -- runs ----------------------------------------------------------------------------
def _marked_pids(marker):
  """Live processes whose environment carries `marker`."""
  needle, pids = f"ROLLX_TEST_RUN={marker}".encode() + b"\0", []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
          continue
      with open(f"/proc/{entry}/environ", "rb") as f:
        if needle in f.read():
          pids.append(int(entry))
    except (OSError, IndexError):
      continue  # gone meanwhile
  return pids


class Run:
  """One training process: own session, stdout+stderr to a file, a marker in its env."""

  def __init__(self, work, name, command, cache, hold=None):
    self.name, self.log = name, work / f"{name}.log"
    self.marker = f"resume-{name}-{os.getpid()}-{id(self)}"
    env = train_env(ROLLX_TEST_RUN=self.marker, JAX_COMPILATION_CACHE_DIR=str(cache),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    if hold is not None:
      env[checkpoint.HOLD_ENV] = str(hold)
    with open(self.log, "w") as log:
      self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    self.leaked = []

  def output(self):
    with open(self.log) as f:
      return f.read()

  def wait_for(self, condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
      if self.proc.poll() is not None:
        raise AssertionError(f"run {self.name} exited with {self.proc.returncode} before "
                             f"{what}:\n{self.output()[-3000:]}")
      if time.monotonic() > deadline:
        raise AssertionError(f"run {self.name}: no {what} after {WAIT_S}s")
      time.sleep(0.05)

  def finish(self):
    try:
      self.proc.wait(timeout=WAIT_S)
    finally:
      self.kill()

  def kill(self):
    """kill -9 of the run's process group; then every process it started (Ray's
    daemons, actors) must be gone. Survivors are killed and kept in `leaked`."""
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, signal.SIGKILL)
    self.proc.wait()
    deadline = time.monotonic() + 60
    while (left := _marked_pids(self.marker)) and time.monotonic() < deadline:
      time.sleep(0.2)  # actors exit once their raylet is gone
    for pid in left:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    self.leaked += left


def _read_raw(step_dir):
  """A checkpoint read with plain Orbax, no pipeline involved."""
  actor = ocp.StandardCheckpointer().restore(step_dir / "actor")
  rng = ocp.StandardCheckpointer().restore(step_dir / "rng")
  meta = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(step_dir / "meta")
  flat = jax.tree_util.tree_flatten_with_path(jax.device_get(actor))[0]
  return ({_key(jax.tree_util.keystr(k)): np.asarray(v) for k, v in flat},
          np.asarray(jax.device_get(rng["key"])), meta)


def _key(keystr):
  """`.opt_state[1][0].mu['x']` and `['opt_state']['1']['0']['mu']['x']` -> opt_state/1/0/mu/x."""
  return "/".join(a or b or c for a, b, c in re.findall(r"\.(\w+)|\['([^']*)'\]|\[(\d+)\]",
                                                        keystr))


def _listing(out):
  return sorted(os.listdir(out / "checkpoints"))


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
  work = tmp_path_factory.mktemp("resume")
  # compiled once by A (or by the session's earlier runs: tests/conftest.py), reused by B, C
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tmp_path_factory.mktemp("jax_cache")
  out = work / "run"
  ckpts = out / "checkpoints"
  train = [sys.executable, "-m", "rollx.train"]
  resume = "--config.resume_from_checkpoint=true"

  def flags(name):  # TensorBoard logs per run, to tell them apart
    return train_flags(out, *EXTRA, f"--config.logging_dir={out}/logs_{name}")

  rec, runs = {}, []
  try:
    a = Run(work, "A", [*train, *flags("A")], cache, hold=2)
    runs.append(a)
    a.wait_for(lambda: checkpoint.HOLD_MESSAGE.format(step=2) in a.output(),
               "hold inside the write of checkpoint 2")
    a.kill()
    rec["A"] = {"listing": _listing(out), "resume": checkpoint.resolve_resume("true", str(out)),
                "tmp_items": sorted(os.listdir(ckpts / "2.orbax-checkpoint-tmp"))}
    rec["raw1"] = _read_raw(ckpts / "1")

    b = Run(work, "B", [sys.executable, "-c", RESUME_PROBE, str(work / "dump"), *flags("B"),
                        resume], cache, hold=3)
    runs.append(b)
    b.wait_for(lambda: (ckpts / "2").is_dir(), "complete checkpoint 2")
    b.kill()
    rec["B"] = {"listing": _listing(out), "resume": checkpoint.resolve_resume("true", str(out))}
    rec["raw2"] = _read_raw(ckpts / "2")
    with open(work / "dump.pkl", "rb") as f:
      rec["dump"] = pickle.load(f)
    with open(work / "dump.json") as f:
      rec["dump"].update(json.load(f))

    c = Run(work, "C", [*train, *flags("C"), resume], cache)
    runs.append(c)
    c.finish()
    rec["C"] = {"listing": _listing(out), "returncode": c.proc.returncode}
    rec["raw3"] = _read_raw(ckpts / "3")
  finally:
    for run in runs:
      run.kill()
  rec["runs"] = {run.name: run for run in runs}
  rec["out"] = out
  rec["events"] = [tb_scalars(out / f"logs_{run.name}" / "frozenlake_grpo") for run in runs]
  return rec


# -- console and TensorBoard ---------------------------------------------------------
def _console_steps(text):
  return [int(s) for s, n in re.findall(r"(?m)^step (\d+)/(\d+) ", text) if int(n) == MAX_STEPS]


# -- tests ---------------------------------------------------------------------------
def test_kill_9_mid_checkpoint_write_resumes_from_the_previous_complete_one(chain):
  a = chain["A"]
  # killed with checkpoint 2 fully written but uncommitted: it is never picked
  assert a["listing"] == ["1", "2.orbax-checkpoint-tmp"]
  assert {"actor", "meta", "rng"} <= set(a["tmp_items"])
  assert a["resume"] == (str(chain["out"] / "checkpoints"), 1)
  assert chain["runs"]["A"].leaked == []
  assert _console_steps(chain["runs"]["A"].output()) == [1, 2]
  # B resumed from 1 and wrote a good checkpoint 2 over the stale temporary directory
  assert chain["dump"]["step"] == 1
  assert chain["B"]["listing"][:2] == ["1", "2"]
  assert chain["raw2"][2]["step"] == 2


def test_kill_9_mid_training_resumes_from_the_last_complete_one_to_max_steps(chain):
  b, c = chain["B"], chain["C"]
  assert b["resume"] == (str(chain["out"] / "checkpoints"), 2)
  assert chain["runs"]["B"].leaked == []
  assert c["returncode"] == 0, chain["runs"]["C"].output()[-3000:]
  assert chain["runs"]["C"].leaked == []
  assert c["listing"] == ["1", "2", "3"]  # the held write of 3 (if reached) was redone
  assert chain["raw3"][2]["step"] == MAX_STEPS
  assert (chain["out"] / "export" / "config.json").is_file()
  # Each run starts at the step of the checkpoint it resumed from and logs each step
  # once; steps after the last complete checkpoint of a killed run are redone.
  b_console = _console_steps(chain["runs"]["B"].output())
  assert b_console[0] == 2 and b_console == list(range(2, 2 + len(b_console)))
  assert _console_steps(chain["runs"]["C"].output()) == [3]
  a, b, c = chain["events"]
  assert sorted(a["score"]) == [0, 1]  # A: steps 0, 1 done, killed inside the save after 1
  b_steps = sorted(b["score"])
  assert b_steps[0] == 1 and b_steps == list(range(1, 1 + len(b_steps)))
  assert sorted(c["score"]) == [2]
  # The curve, each step from the run whose result the next one resumed from, is
  # complete: every step up to a checkpoint was on disk before the kill.
  for run, steps in ((a, (0, 1)), (b, (1,)), (c, (2,))):
    for tag in ("score", "loss", "lr", "kl", "kl_coef", "tokens_per_s"):
      assert all(s in run.get(tag, {}) for s in steps), (tag, steps)


def test_restore_is_bitwise_and_training_continues_the_curve(chain):
  dump = chain["dump"]
  saved_actor, saved_rng, saved_meta = chain["raw1"]
  restored = {_key(k): v for k, v in dump["actor"].items()}
  # params, optimizer state and its step counter: every leaf, bit for bit
  assert sorted(restored) == sorted(saved_actor)
  assert any(k.startswith("opt_state/") for k in saved_actor)
  for k, v in saved_actor.items():
    assert restored[k].dtype == v.dtype and np.array_equal(restored[k], v), k
  assert int(saved_actor["step"]) == 1  # one optimizer update per step in this config
  # LoRA: the adapters train (with optimizer state), the base is frozen (none)
  assert saved_actor["params/layers/q_proj_lora_a"].shape[-1] == LORA_RANK
  assert "frozen/layers/q_proj" in saved_actor and "params/layers/q_proj" not in saved_actor
  assert not any(k.startswith("opt_state/") and k.endswith("/layers/q_proj") for k in saved_actor)
  np.testing.assert_array_equal(dump["rng"], saved_rng)
  assert dump["rng"].dtype == saved_rng.dtype
  assert dump["step"] == saved_meta["step"] == 1
  assert dump["kl_coef"] == saved_meta["kl_coef"] != INIT_KL_COEF  # exact, and it moved
  assert dump["train_streams"] == saved_meta["train_streams"] != {}
  assert dump["val_streams"] == saved_meta["val_streams"] != {}
  assert dump["server_versions"] == [1]  # the restored policy is what the servers serve

  # The curve continues: B's first step is the saved one, from the restored state.
  a_run, b_run, c_run = chain["events"]
  b_first = min(b_run["score"])
  assert b_first == saved_meta["step"]
  # the KL controller moves on from the restored coefficient
  kl = b_run["kl"][b_first]
  expected = saved_meta["kl_coef"] * (1 + min(max(kl / TARGET_KL - 1, -0.2), 0.2) * EPISODES / KL_HORIZON)
  np.testing.assert_allclose(b_run["kl_coef"][b_first], expected, rtol=1e-6)  # float32 log
  np.testing.assert_allclose(chain["raw2"][2]["kl_coef"], expected, rtol=1e-6)
  # the optimizer step, and with it the warmup schedule, goes on: 1 -> 2 -> 3
  assert int(chain["raw2"][0]["step"]) == 2 and int(chain["raw3"][0]["step"]) == 3
  assert a_run["lr"][0] < b_run["lr"][1] < c_run["lr"][2]


def test_with_adapters_syncs_send_the_adapters_alone_and_peft_loads_the_export(chain):
  import peft
  import torch
  import transformers
  from rollx import models
  a_run = chain["events"][0]
  saved_actor = chain["raw1"][0]
  adapter_bytes = sum(v.nbytes for k, v in saved_actor.items() if k.startswith("params/"))
  base_bytes = sum(v.nbytes for k, v in saved_actor.items() if k.startswith("frozen/"))
  assert a_run["weight_sync/bytes"][0] == pytest.approx(adapter_bytes, rel=0.01)
  assert adapter_bytes < base_bytes / 3
  export = chain["out"] / "export"
  folded = transformers.AutoModelForCausalLM.from_pretrained(str(export), local_files_only=True)
  base = transformers.AutoModelForCausalLM.from_pretrained(models.DEFAULT_MODEL_DIR,
                                                           local_files_only=True)
  ids = torch.tensor([[1, 5, 9, 14, 3, 27]])
  with torch.no_grad():
    plain = base.eval()(ids).logits.numpy()  # (before peft wraps the base in place)
    adapted = peft.PeftModel.from_pretrained(base, str(export / "adapter"))
    want, got = folded.eval()(ids).logits.numpy(), adapted.eval()(ids).logits.numpy()
  assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
  assert np.abs(plain - want).max() > 1e-3 * np.abs(want).max()  # the adapters trained


def test_rollx_eval_reads_the_adapters_of_a_lora_checkpoint_and_of_its_peft_export(chain):
  from rollx import config as config_lib, eval as eval_lib
  from rollx.models import lora
  config = config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py"))
  config.actor_train.model_args.lora.rank = LORA_RANK
  ckpt = eval_lib.resolve_checkpoint(str(chain["out"] / "checkpoints"))
  assert (ckpt.kind, ckpt.step) == ("orbax", MAX_STEPS)
  from_orbax = eval_lib.restore_params(ckpt, config)
  peft_dir = eval_lib.resolve_checkpoint(str(chain["out"] / "export" / "adapter"))
  assert peft_dir.kind == "peft"
  from_peft = eval_lib.load_adapters(peft_dir, config)
  saved = chain["raw3"][0]
  for weights in (from_orbax, from_peft):
    assert isinstance(weights, lora.AdapterWeights) and weights.scale == 16.0 / LORA_RANK
    assert sorted(weights.tensors["layers"]) == sorted(
        k.split("/")[-1] for k in saved if k.startswith("params/layers/"))
    for key, value in weights.tensors["layers"].items():
      np.testing.assert_array_equal(value, saved[f"params/layers/{key}"])
  # the checkpoint read without its LoRA settings is a named mismatch
  config.actor_train.model_args.lora.rank = 0
  with pytest.raises(eval_lib.CheckpointProblem, match="params/embed_tokens is missing"):
    eval_lib.restore_params(ckpt, config)
