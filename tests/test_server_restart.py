"""A rollout server that dies does not end the run: `kill -9` of the only JetStream server
actor in the middle of a step's collection, in a real 3-step run (Ray env workers,
scheduler, the pipeline's loop)."""

import os
import signal
import threading
import time

import pytest
import ray

from rollx import checks, config as config_lib
from rollx.errors import RolloutError
from tests.conftest import ROOT


def small_run(tmp_path, kill_after_s=0.1, **server_args):
  """A 3-step FrozenLake pipeline (16 episodes a step, one server) and a list that
  records, per step, (batch, collection start, end); step 1's collection kills the
  server `kill_after_s` in, and `killed` gets the time. A sync step's episodes start when
  its collection does and take far longer than 0.1 s together (seen at 0.8 s on a fast
  machine), so the kill lands while they still need the server."""
  from rollx.pipeline import AgenticPipeline
  c = config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py"))
  c.update(max_steps=3, rollout_batch_size=16, eval_steps=0, min_informative_groups=0,
           save_steps=100, output_dir=str(tmp_path), logging_dir=str(tmp_path / "logs"),
           render_save_dir=str(tmp_path / "render"))
  c.train_env_manager.update(num_env_groups=2, group_size=8)
  c.actor_train.device_mapping = (0,)
  c.actor_train.training_args.update(per_device_train_batch_size=16, warmup_steps=0)
  c.actor_infer.strategy_args.update(max_concurrent_decodes=16, **server_args)
  pipeline = AgenticPipeline(checks.validate(c))
  first_pid = ray.get(pipeline.servers.actors[0].pid.remote())
  collected, killed = [], []
  collect = pipeline.collect

  def collect_and_kill(metrics):
    if pipeline.step == 1:  # once the step's episodes are under way
      threading.Timer(kill_after_s, lambda: (os.kill(first_pid, signal.SIGKILL),
                                    killed.append(time.time()))).start()
    start = time.time()
    out = collect(metrics)
    collected.append((out[0], start, time.time()))
    return out

  pipeline.collect = collect_and_kill
  return pipeline, first_pid, collected, killed


def test_killing_the_only_server_mid_collection_does_not_end_the_run(tmp_path):
  pipeline, first_pid, collected, killed = small_run(tmp_path, restart_timeout_s=240.0)
  server = pipeline.servers.actors[0]
  after, waits = {}, {}

  def on_step(step, metrics):
    waits[step] = sum(ray.get(w.status.remote())["restart_waits"]
                      for w in pipeline.train_rollout.workers)
    if step >= 1:
      after[step] = (ray.get(server.pid.remote()), ray.get(server.version.remote()))
    return False

  pipeline.run(on_step)

  assert len(collected) == 3  # every step ran
  for step, (batch, _, _) in enumerate(collected):
    tickets = [(t.ticket.group_id, t.ticket.generation, t.ticket.env_id)
               for t in batch.trajectories]
    assert len(tickets) == 16 and len(set(tickets)) == 16, step  # full and unique
    response = batch.response_mask > 0
    assert (batch.token_versions[response] == step).all(), step  # the current weights
  _, start, end = collected[1]
  # the kill landed inside step 1's collection, whose requests then found no server alive
  # and waited for the restart (the env workers' clients count such waits)
  assert killed and start < killed[0] < end, (start, killed, end)
  assert waits[0] == 0 and waits[1] > 0 and waits[2] == waits[1], waits  # in step 1 only
  # a new process, which got the current weights before serving, and the next push
  assert after[1][0] != first_pid and after[1][1] == 1 and after[2] == (after[1][0], 2)


def test_a_server_that_cannot_restart_ends_the_run_with_one_line_and_a_checkpoint(tmp_path):
  # killed as step 1's collection starts: its requests find no server, and none comes back
  pipeline, _, collected, _ = small_run(tmp_path, 0.0, max_restarts=0, restart_timeout_s=3.0)
  address = pipeline.servers.addresses[0]
  with pytest.raises(RolloutError) as failure:
    pipeline.run()
  message = str(failure.value)
  assert "\n" not in message and address in message and "NoServerAliveError" in message
  assert len(collected) == 1  # step 0 finished; step 1 never got its batch
  assert os.path.isdir(tmp_path / "checkpoints" / "1")  # what step 0 learned is kept
