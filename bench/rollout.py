"""Rollout throughput: the scheduler's async mode vs. a lockstep baseline, one process.

    python bench/rollout.py [--envs 64 --batches 4 --latency-ms 50 --train-ms 0]
    python bench/rollout.py --quick          # `make bench`: 16 envs, 2 batches

Same model (the scripted random-action policy in real Qwen2 weights), same in-process
JetStream server, same `--envs` FrozenLake envs (groups of 8) whose every step waits a
latency drawn from a heavy-tailed (log-normal, sigma 1.2) distribution, as tool calls
do. Both sides run the training code: one EnvWorker's env loops (`run_rollout_loop`)
taking tickets from a RolloutScheduler, and a trainer loop doing what the pipeline's
step does: weight sync (the server's `update_params`, then `set_version`), then
`get_batch(rollout_batch_size)` (every env's episode: the shipped configs' batch), then
the learn phase (`--train-ms` of sleep; 0: rollout only). `--batches` batches each:
- rollx: the scheduler as async training runs it (`async_generation_ratio` 1: at most
  one batch of groups ahead, <= 1 version stale); no barrier between envs;
- lockstep baseline: the scheduler in sync mode (`async_generation_ratio` 0: a round
  of episodes per `get_batch`) and, on top, a barrier per turn: every env of the round
  sends its generate request, then all go out together; an env steps when its answer
  is back, and the next turn waits for the slowest.
Prints env-steps/s and trajectories/s (of the batches the trainer received) for both,
and the ratio async / lockstep.
"""

import argparse
import asyncio
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import envs  # noqa: E402
from envs.frozenlake import FrozenLake  # noqa: E402
from rollx import checks, config as config_lib, models  # noqa: E402
from rollx.recipes import scripted  # noqa: E402
from rollx.rollout.env_worker import EnvWorker  # noqa: E402
from rollx.rollout.scheduler import RolloutScheduler  # noqa: E402
from rollx.serving import PREFILL_BUCKETS  # noqa: E402
from rollx.serving import server as server_lib  # noqa: E402

GROUP = 8
BATCH_TIMEOUT_S = 300  # a batch of the default size takes ~25 s on 2 cores: a hang fails


class SlowFrozenLake(FrozenLake):
  """FrozenLake whose steps wait like a remote tool call (heavy-tailed latency)."""
  median_s = 0.05
  rng = np.random.default_rng(0)

  async def astep(self, action_text):
    await asyncio.sleep(float(self.median_s * self.rng.lognormal(0.0, 1.2)))
    return self.step(action_text)


envs.register_env("SlowFrozenLake")(SlowFrozenLake)


def make_config(policy_dir: str, num_envs: int, ratio: float):
  c = config_lib.default_config()
  c.pretrain = policy_dir
  c.async_generation_ratio = ratio
  c.rollout_batch_size = num_envs  # one episode per env per batch, as the shipped configs
  c.actor_infer.strategy_args.update(max_concurrent_decodes=num_envs, max_prefill_length=1024,
                                     max_cache_length=1100)
  c.custom_envs.Slow = config_lib.env_entry("SlowFrozenLake", dict(max_steps=10),
                                            max_tokens_per_step=8)
  c.train_env_manager.update(num_env_groups=num_envs // GROUP, group_size=GROUP, tags=("Slow",),
                             max_env_num_per_worker=num_envs)
  c.val_env_manager.tags = ("Slow",)
  return checks.validate(c)


class TurnBarrier:
  """Every env still in the round reaches its next generate before any request goes out."""

  def __init__(self):
    self.parties, self.arrived, self.release = 0, 0, asyncio.Event()

  def new_round(self, parties: int):
    self.parties, self.arrived, self.release = parties, 0, asyncio.Event()

  async def wait(self):
    self.arrived += 1
    release = self.release
    if self.arrived >= self.parties:
      self._open()
    await release.wait()

  def leave(self):
    self.parties -= 1
    if self.parties and self.arrived >= self.parties:
      self._open()

  def _open(self):
    self.release.set()
    self.release, self.arrived = asyncio.Event(), 0


class LockstepLink:
  """The scheduler as the env loops see it, with an env leaving the turn barrier when
  its episode ends (an env that raised replays its ticket: it stays)."""

  def __init__(self, scheduler, barrier):
    self.scheduler, self.barrier = scheduler, barrier

  async def next_ticket(self, env_id):
    return await self.scheduler.next_ticket(env_id)

  async def put(self, trajectory):
    self.barrier.leave()
    await self.scheduler.put(trajectory)

  async def report_error(self, ticket, error):
    await self.scheduler.report_error(ticket, error)

  async def fail(self, error):
    await self.scheduler.fail(error)


async def run(config, server, params, batches: int, train_s: float, lockstep: bool):
  """(env steps, trajectories, seconds, mean staleness) of `batches` batches taken by a
  trainer loop as the pipeline's step takes them."""
  scheduler = RolloutScheduler(config)
  env_ids = sorted(scheduler.slots)
  barrier = TurnBarrier()
  link = LockstepLink(scheduler, barrier) if lockstep else scheduler
  worker = EnvWorker(config, "train_env_manager", env_ids, link, [server.address])
  if lockstep:
    for m in worker.managers:
      m.generate = _behind(barrier, m.generate)
  steps = trajectories = 0
  staleness = []
  start = time.perf_counter()
  await worker.start()
  try:
    for step in range(batches):
      server.update_params(params, step)  # the pipeline's weight sync, every step
      scheduler.set_version(step)
      barrier.new_round(len(env_ids))
      try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch(config.rollout_batch_size), BATCH_TIMEOUT_S)
      except asyncio.TimeoutError:
        raise RuntimeError(
            f"{'lockstep' if lockstep else 'async'} side: batch {step} not complete after "
            f"{BATCH_TIMEOUT_S} s (scheduler counters {dict(scheduler.counters)}, "
            f"{len(scheduler._outstanding)} episodes outstanding)") from None
      steps += sum(t.num_turns for t in batch.trajectories)
      trajectories += len(batch.trajectories)
      staleness.append(metrics.get("rollout/staleness_mean", 0.0))
      await asyncio.sleep(train_s)  # the learn phase (rollx: the env loops go on meanwhile)
    elapsed = time.perf_counter() - start
    await worker.status()  # raises what an env loop raised
  finally:
    await scheduler.stop()
    for task in worker._tasks:
      task.cancel()
    await asyncio.gather(*worker._tasks, return_exceptions=True)
    await worker.client.close()
  return steps, trajectories, elapsed, float(np.mean(staleness))


def _behind(barrier, generate):
  async def wrapped(*args, **kwargs):
    await barrier.wait()
    return await generate(*args, **kwargs)
  return wrapped


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--envs", type=int, default=64, help="a multiple of 8 (groups of 8)")
  p.add_argument("--batches", type=int, default=4, help="get_batch calls per side")
  p.add_argument("--latency-ms", type=float, default=50.0, help="median env-step latency")
  p.add_argument("--train-ms", type=float, default=0.0, help="learn phase per batch")
  p.add_argument("--quick", action="store_true", help="16 envs, 2 batches (make bench)")
  args = p.parse_args()
  if args.quick:
    args.envs, args.batches = 16, 2
  if args.envs % GROUP:
    p.error(f"--envs must be a multiple of {GROUP}")
  SlowFrozenLake.median_s = args.latency_ms / 1000
  policy_dir = scripted.random_action_policy_dir(tempfile.mkdtemp())
  lock_config = make_config(policy_dir, args.envs, 0.0)
  async_config = make_config(policy_dir, args.envs, 1.0)
  params = models.load_model(policy_dir).params
  server = server_lib.server_from_config(lock_config)
  try:
    limit = lock_config.actor_infer.strategy_args.max_prefill_length
    server.engine.warmup([b for b in PREFILL_BUCKETS if b <= limit])  # compiles are not timed
    train_s = args.train_ms / 1000
    lock = asyncio.run(run(lock_config, server, params, args.batches, train_s, lockstep=True))
    rollx = asyncio.run(run(async_config, server, params, args.batches, train_s,
                            lockstep=False))
  finally:
    server.stop()
  rate = lambda r: (r[0] / r[2], r[1] / r[2])
  (a_steps, a_traj), (l_steps, l_traj) = rate(rollx), rate(lock)
  print(f"{args.envs} FrozenLake envs, {args.batches} batches of {args.envs} episodes, step "
        f"latency lognormal(median {args.latency_ms:.0f} ms, sigma 1.2), learn phase "
        f"{args.train_ms:.0f} ms: rollx async (ratio 1, staleness {rollx[3]:.2f}) "
        f"{a_steps:.1f} env-steps/s, {a_traj:.2f} traj/s | lockstep {l_steps:.1f} env-steps/s, "
        f"{l_traj:.2f} traj/s | {a_traj / l_traj:.2f}x traj/s, ratio {a_steps / l_steps:.2f}x "
        f"env-steps/s")


if __name__ == "__main__":
  main()
