"""Rollout throughput: env-granular async loops vs. a lockstep baseline, one run.

    python bench/rollout.py [--envs 64 --trajectories 256 --latency-ms 50]

Same model (the scripted random-action policy in real Qwen2 weights), same
in-process JetStream server, same 64 FrozenLake envs whose every step waits a
latency drawn from a heavy-tailed (log-normal, sigma 1.2) distribution, as tool
calls do:
- rollx: each env runs its own `run_rollout_loop` (EnvManager + RolloutScheduler,
  async mode): no barrier anywhere;
- lockstep baseline: all envs take a turn together: one batch of generate requests,
  wait for all; all envs step, wait for the slowest; a new round of episodes only
  when every episode of the round has ended.
Prints env-steps/s and trajectories/s for both and the ratio (target >= 2x).
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
from rollx import config as config_lib, serve  # noqa: E402
from rollx.models import hf, scripted  # noqa: E402
from rollx.rollout.env_manager import EnvManager  # noqa: E402
from rollx.rollout.scheduler import RolloutScheduler, env_layout, level_seed  # noqa: E402
from rollx.rollout.types import Ticket  # noqa: E402
from rollx.serving.client import RolloutClient  # noqa: E402


class SlowFrozenLake(FrozenLake):
  """FrozenLake whose steps wait like a remote tool call (heavy-tailed latency)."""
  median_s = 0.05
  rng = np.random.default_rng(0)

  async def astep(self, action_text):
    await asyncio.sleep(float(self.median_s * self.rng.lognormal(0.0, 1.2)))
    return self.step(action_text)


envs.register_env("SlowFrozenLake")(SlowFrozenLake)


def make_config(policy_dir, num_envs):
  c = config_lib.default_config()
  c.pretrain = policy_dir
  c.async_generation_ratio = 1000.0  # never stale here: only throughput is measured
  c.actor_infer.strategy_args.update(max_concurrent_decodes=num_envs, max_prefill_length=1024,
                                     max_cache_length=1100)
  c.custom_envs.Slow = config_lib.env_entry("SlowFrozenLake", dict(max_steps=10),
                                            max_tokens_per_step=8)
  c.train_env_manager.update(num_env_groups=num_envs // 8, group_size=8, tags=("Slow",))
  c.val_env_manager.tags = ("Slow",)
  return config_lib.validate(c)


def managers_for(config, tokenizer, client):
  return [EnvManager(s.env_id, s.tag, config.custom_envs[s.tag].to_dict(), tokenizer,
                     client.generate, sequence_length=1024)
          for s in env_layout(config.train_env_manager)]


async def run_async(config, tokenizer, address, trajectories):
  scheduler = RolloutScheduler(config)
  scheduler.async_ratio = float("inf")  # no lead limit either: the loops never wait
  client = RolloutClient([address])
  managers = managers_for(config, tokenizer, client)
  start = time.perf_counter()
  loops = [asyncio.ensure_future(m.run_rollout_loop(scheduler)) for m in managers]
  while scheduler.counters["trajectories"] < trajectories:
    await asyncio.sleep(0.01)
  elapsed = time.perf_counter() - start
  done = scheduler.counters["trajectories"]
  steps = sum(len(t.transcript) for ts in scheduler._arrived.values() for t in ts)
  await scheduler.stop()
  for loop in loops:
    loop.cancel()
  await asyncio.gather(*loops, return_exceptions=True)
  await client.close()
  return steps, done, elapsed


class TurnBarrier:
  """Every active env reaches its next generate before any request goes out."""

  def __init__(self, parties):
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


async def run_lockstep(config, tokenizer, address, trajectories):
  """The same episodes through the same EnvManager code, with a barrier per turn and
  per round of episodes."""
  client = RolloutClient([address])
  layout = {s.env_id: s for s in env_layout(config.train_env_manager)}
  barrier = TurnBarrier(0)

  async def generate(*args, **kwargs):
    await barrier.wait()
    return await client.generate(*args, **kwargs)

  managers = [EnvManager(i, s.tag, config.custom_envs[s.tag].to_dict(), tokenizer, generate,
                         sequence_length=1024) for i, s in layout.items()]

  async def episode(m, ticket):
    try:
      return await m.run_episode(ticket)
    finally:
      barrier.leave()

  steps = done = generation = 0
  start = time.perf_counter()
  while done < trajectories:
    barrier.parties = len(managers)
    ticks = [Ticket(m.env_id, m.tag, layout[m.env_id].group_id, generation,
                    level_seed(0, "bench", m.tag, layout[m.env_id].group_id, generation))
             for m in managers]
    trajs = await asyncio.gather(*(episode(m, t) for m, t in zip(managers, ticks)))
    steps += sum(t.num_turns for t in trajs)
    done += len(trajs)
    generation += 1
  elapsed = time.perf_counter() - start
  await client.close()
  return steps, done, elapsed


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--envs", type=int, default=64)
  p.add_argument("--trajectories", type=int, default=256)
  p.add_argument("--latency-ms", type=float, default=50.0)
  args = p.parse_args()
  SlowFrozenLake.median_s = args.latency_ms / 1000
  policy_dir = scripted.random_action_policy_dir(tempfile.mkdtemp())
  config = make_config(policy_dir, args.envs)
  tokenizer = hf.load_tokenizer(policy_dir)
  server = serve.start_server(config)
  asyncio.run(run_lockstep(config, tokenizer, server.address, 1))  # compile every bucket
  lock = asyncio.run(run_lockstep(config, tokenizer, server.address, args.trajectories))
  rollx = asyncio.run(run_async(config, tokenizer, server.address, args.trajectories))
  server.stop()
  rate = lambda r: (r[0] / r[2], r[1] / r[2])
  (a_steps, a_traj), (l_steps, l_traj) = rate(rollx), rate(lock)
  print(f"{args.envs} FrozenLake envs, step latency lognormal(median {args.latency_ms:.0f} ms, "
        f"sigma 1.2): rollx async {a_steps:.1f} env-steps/s, {a_traj:.2f} traj/s | lockstep "
        f"{l_steps:.1f} env-steps/s, {l_traj:.2f} traj/s | ratio {a_steps / l_steps:.2f}x "
        f"env-steps/s, {a_traj / l_traj:.2f}x traj/s")


if __name__ == "__main__":
  main()
