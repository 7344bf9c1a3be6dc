"""Multi-host JAX on one machine: 2 processes x 4 CPU devices equal 1 process x 8.

Each process is started the way launch/node.sh starts one per host (ROLLX_*
variables -> rollx.parallel.distributed.maybe_initialize), builds the same global
mesh over all 8 devices, and runs the sharded Trainer step of tests/parallel/test_sharding.py;
process 0 gathers the results to host and pickles them for the test to compare
with the single-process run at test_sharding's tolerances (float32, rel 1e-5).
"""

import os
import pickle
import socket
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest

from rollx.parallel import distributed

# Not tests.conftest.ROOT: importing conftest would give the worker processes its
# 8-device XLA_FLAGS.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# dp2_tp2_pp2: pipeline stages cross the process boundary (devices 0-3 are process
# 0's, the pipeline axis is outermost), tensor and data shards stay inside a process;
# fsdp4_tp2: the fsdp all-gathers cross it. ~1 min each on 2 cores.
MESHES = {"dp2_tp2_pp2": {"dp": 2, "tp": 2, "pp": 2, "microbatches": 2},
          "fsdp4_tp2": {"fsdp": 4, "tp": 2}}
HEAD = "lm"
STEPS = 2


def _wait_all(procs, timeout):
  """Outputs of all processes; each must exit 0."""
  logs = [p.communicate(timeout=timeout)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-4000:]
  return logs


def _kill_all(procs):
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def _compute(mesh_kwargs, devices, params, batch):
  """test_sharding.run's train steps on this mesh, gathered with distributed.to_host."""
  from rollx.parallel import mesh as mesh_lib
  from rollx.trainer.step import Trainer
  from tests.parallel import test_sharding as ts
  w = ts.worker(**mesh_kwargs)
  mesh = mesh_lib.make_mesh(w.strategy_args, devices=devices)
  trainer = Trainer(ts.CFG, w, mesh, ts.LOSSES[HEAD], total_steps=10, head=HEAD)
  state = trainer.init_state(params)
  batch = trainer.batch_sharding(batch)
  rng = jax.random.PRNGKey(1)
  metrics = []
  for _ in range(STEPS):
    state, m = trainer.update(state, batch, rng)
    metrics.append(m)
  out = distributed.to_host({"metrics": metrics, "params": state.params})
  out["num_traces"] = trainer.num_traces
  out["q_spec"] = str(state.params["layers"]["q_proj"].sharding.spec)
  q_devices = state.params["layers"]["q_proj"].sharding.device_set
  out["q_devices"] = (len(q_devices), sorted({d.process_index for d in q_devices}))
  return out


def _process_main(mesh_name: str, inputs_path: str, out_path: str) -> None:
  """One of the two processes (run as a script by the test)."""
  assert distributed.maybe_initialize(), "ROLLX_* variables missing"
  assert jax.process_count() == 2 and jax.local_device_count() == 4
  assert len(jax.devices()) == 8
  with open(inputs_path, "rb") as f:
    params, batch = pickle.load(f)  # made once by the test: no per-process model init
  results = {"mesh": mesh_name, "result": _compute(MESHES[mesh_name], jax.devices(), params, batch)}
  # Something only process 0 has, as a rollout batch from Ray would be.
  payload = {"rows": np.arange(12).reshape(3, 4), "tags": ["a", "b"]} \
      if distributed.is_coordinator() else None
  results["broadcast"] = distributed.broadcast_object(payload)
  results["process_index"] = jax.process_index()
  with open(f"{out_path}.{jax.process_index()}", "wb") as f:
    pickle.dump(results, f)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture(scope="module", params=["dp2_tp2_pp2",
                                        pytest.param("fsdp4_tp2", marks=pytest.mark.slow)])
def two_processes(request, tmp_path_factory):
  mesh_name = request.param
  from tests.parallel import test_sharding as ts
  tmp = tmp_path_factory.mktemp("multihost")
  inputs, out = str(tmp / "inputs.pkl"), str(tmp / "result")
  with open(inputs, "wb") as f:
    pickle.dump((ts.initial_params(HEAD), ts.make_batch()), f)
  port = _free_port()
  procs = []
  try:
    for i in range(2):
      env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
                 XLA_FLAGS="--xla_force_host_platform_device_count=4",
                 **{distributed.COORDINATOR: f"127.0.0.1:{port}",
                    distributed.NUM_PROCESSES: "2", distributed.PROCESS_ID: str(i),
                    distributed.TIMEOUT: "120"})
      procs.append(subprocess.Popen(
          [sys.executable, os.path.abspath(__file__), mesh_name, inputs, out], cwd=ROOT, env=env,
          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    _wait_all(procs, 400)
  finally:
    _kill_all(procs)
  results = []
  for i in range(2):
    with open(f"{out}.{i}", "rb") as f:
      results.append(pickle.load(f))
  return results


def test_two_processes_equal_one_process(two_processes):
  from tests.parallel import test_sharding as ts
  assert len(jax.devices()) == 8  # tests/conftest.py: 8 simulated CPU devices
  mesh_name = two_processes[0]["mesh"]
  want = _compute(MESHES[mesh_name], jax.devices(), ts.initial_params(HEAD), ts.make_batch())
  for got in (r["result"] for r in two_processes):
    for step in range(STEPS):
      assert rel_err(got["metrics"][step]["loss"], want["metrics"][step]["loss"]) < 1e-5
      assert rel_err(got["metrics"][step]["grad_norm"], want["metrics"][step]["grad_norm"]) < 1e-5
    for path, a in jax.tree_util.tree_flatten_with_path(got["params"])[0]:
      b = want["params"]
      for k in path:
        b = b[k.key]
      assert rel_err(a, b) < 1e-5, path
    assert got["num_traces"] == 1  # two steps, one compilation
    assert got["q_spec"] == want["q_spec"] and got["q_devices"] == (8, [0, 1])


def test_broadcast_reaches_every_process(two_processes):
  assert [r["process_index"] for r in two_processes] == [0, 1]
  for r in two_processes:
    np.testing.assert_array_equal(r["broadcast"]["rows"], np.arange(12).reshape(3, 4))
    assert r["broadcast"]["tags"] == ["a", "b"]


@pytest.mark.parametrize("env,match", [
    ({distributed.COORDINATOR: "nohost"}, "expected host:port"),
    ({distributed.COORDINATOR: "h:1", distributed.NUM_PROCESSES: "2"},
     f"{distributed.PROCESS_ID} is not"),
    ({distributed.COORDINATOR: "h:1", distributed.NUM_PROCESSES: "2",
      distributed.PROCESS_ID: "2"}, "must be in"),
    ({distributed.COORDINATOR: "h:1", distributed.NUM_PROCESSES: "two",
      distributed.PROCESS_ID: "0"}, "is not an integer"),
    ({distributed.PROCESS_ID: "1"}, f"{distributed.COORDINATOR} is not"),
    ({distributed.AUTO: "yes"}, "expected 'auto'"),
])
def test_bad_environment_names_the_variable(env, match):
  with pytest.raises(distributed.DistributedEnvError, match=match):
    distributed.settings_from_env(env)


def test_single_process_settings():
  assert distributed.settings_from_env({}) is None
  assert distributed.settings_from_env({distributed.COORDINATOR: "h:1",
                                        distributed.NUM_PROCESSES: "1",
                                        distributed.PROCESS_ID: "0"}) is None
  assert distributed.settings_from_env({distributed.AUTO: "auto"}).auto
  s = distributed.settings_from_env({distributed.COORDINATOR: "10.0.0.2:8476",
                                     distributed.NUM_PROCESSES: "4",
                                     distributed.PROCESS_ID: "3",
                                     distributed.LOCAL_DEVICE_IDS: "0,1"})
  assert (s.coordinator_address, s.num_processes, s.process_id, s.local_device_ids) == \
      ("10.0.0.2:8476", 4, 3, (0, 1))
  assert not distributed.maybe_initialize({})  # one process: nothing to start
  assert distributed.broadcast_object({"x": 1}) == {"x": 1}


if __name__ == "__main__":
  _process_main(*sys.argv[1:4])


def _train_two_processes(out, *overrides):
  """`python -m rollx.train` as JAX processes 0 and 1 (4 CPU devices each), started by
  launch/node.sh as on two hosts; returns their logs."""
  port = _free_port()
  procs = []
  try:
    for i in range(2):
      env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
                 XLA_FLAGS="--xla_force_host_platform_device_count=4")
      procs.append(subprocess.Popen(
          ["bash", "launch/node.sh", "train", f"--index={i}", "--num-hosts=2",
           "--head-address=127.0.0.1", f"--jax-port={port}", "--no-ray",
           f"--python={sys.executable}", "--", "--config=configs/frozenlake.py",
           f"--config.output_dir={out}", f"--config.logging_dir={out}/logs",
           f"--config.render_save_dir={out}/render", "--config.eval_steps=0",
           "--config.save_steps=1", "--config.rollout_batch_size=8",
           "--config.train_env_manager.num_env_groups=2", "--config.train_env_manager.group_size=4",
           "--config.custom_envs.FrozenLake.env_config.max_steps=4",
           "--config.actor_train.strategy_args.fsdp_size=4",  # fsdp spans the processes
           "--config.actor_train.strategy_args.tp_size=2",
           "--config.actor_train.training_args.per_device_train_batch_size=2",
           "--config.actor_infer.strategy_args.max_concurrent_decodes=8", *overrides],
          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = _wait_all(procs, 900)
  finally:
    _kill_all(procs)
  return logs


@pytest.mark.slow
def test_two_process_training_run_and_resume(tmp_path):
  """Process 0 drives the Ray rollout and broadcasts each batch, both processes run the
  sharded steps, checkpoints hold both processes' shards, process 0 writes the logs
  and the export; a second run resumes from the last checkpoint."""
  out = tmp_path / "run"
  for log in _train_two_processes(out, "--config.max_steps=2"):
    assert "step 2/2" in log and "ROLLX_NUM_PROCESSES=2" in log
  assert sorted(os.listdir(out / "checkpoints")) == ["1", "2"]
  assert (out / "export" / "config.json").exists()
  assert _logged_steps(out / "logs" / "frozenlake_grpo") == [0, 1]  # once: process 0's
  for log in _train_two_processes(out, "--config.max_steps=3",
                                  "--config.resume_from_checkpoint=true"):
    assert "step 3/3" in log and "step 1/3" not in log
  assert sorted(os.listdir(out / "checkpoints")) == ["1", "2", "3"]
  assert _logged_steps(out / "logs" / "frozenlake_grpo") == [0, 1, 2]


def _logged_steps(logs, tag="score"):
  """Steps of every `tag` scalar in the TensorBoard event files, duplicates kept."""
  from tensorboardX.proto import event_pb2
  steps = []
  for name in os.listdir(logs):
    data = (logs / name).read_bytes()
    i = 0
    while i + 12 <= len(data):  # TFRecords: length, crc, event, crc
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      steps += [event.step for v in event.summary.value if v.tag == tag]
  return sorted(steps)
