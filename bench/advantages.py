"""Advantage computation per training step: bucketed (padded) rows vs. exact shapes.

    python bench/advantages.py [--steps 20] [--estimator grpo]
    python bench/advantages.py --quick     # `make bench`: 4 steps

A training step's sample count changes every step (step-wise FrozenLake: ~400-700
rows), and eager JAX compiles each op once per shape. Both sides compute the same
advantages on the same sequence of batches in the same process (checked equal):
- rollx: `compute_advantages`, rows padded to a power of two (compiled ops reused);
- baseline: the estimator on the exact shapes (the pre-bucketing path: the same
  episode view, `on_episodes(..., shape_stable=False)`), with compute_advantages' steps
  around it (the `episode_reward_gamma` discount, whitening, the clip).
Prints ms per step for each and the ratio, after one warm-up batch each.
"""

import argparse
import os
import sys
import time

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollx.algos import advantages as adv_lib  # noqa: E402
from configs import frozenlake  # noqa: E402


def frozenlake_like_batch(rng, episodes: int = 128, width: int = 160):
  """Step-wise rows of `episodes` episodes (16 groups of 8, 1-10 steps each), a 4-token
  answer per row, as the FrozenLake config makes them."""
  steps = rng.integers(1, 11, episodes)
  episode_ids = np.repeat(np.arange(episodes), steps)
  n = len(episode_ids)
  mask = np.zeros((n, width), np.float32)
  mask[:, 27:31] = 1
  success = rng.random(episodes) < 0.3
  last = np.concatenate([np.arange(s) == s - 1 for s in steps])
  return {"response_mask": mask,
          "scores": (last & success[episode_ids]).astype(np.float32),
          "episode_scores": success[episode_ids].astype(np.float32),
          "group_ids": (episode_ids // 8).astype(np.int32),
          "tag_ids": np.zeros(n, np.int32),
          "episode_ids": episode_ids.astype(np.int32),
          "step_index": np.concatenate([np.arange(s) for s in steps]).astype(np.int32),
          "anchor_ids": rng.integers(0, n // 3, n).astype(np.int32),
          "token_kl": np.zeros((n, width), np.float32),
          "values": np.zeros((n, width), np.float32)}


def exact_shapes(inputs, config):
  """What compute_advantages does, on the batch as it is (no padding): the episode score
  discounted per move where the config says so, the estimator, then whitening over
  the samples with a policy gradient (the others stay 0) and the clip."""
  gamma = config.get("episode_reward_gamma", 1.0)
  if gamma < 1.0:
    inputs = dict(inputs, episode_scores=adv_lib.discounted_episode_scores(
        inputs["scores"], inputs["episode_ids"], inputs["step_index"], gamma))
  estimator = {"gae": adv_lib.gae, "grpo": adv_lib.grpo, "reinforce": adv_lib.reinforce,
               "gigpo": adv_lib.gigpo}[config.adv_estimator]
  if config.adv_estimator != "gigpo":  # step rows -> episodes, as in ADVANTAGES
    estimator = adv_lib.on_episodes(estimator, shape_stable=False)
  adv, _ = estimator({k: jnp.asarray(v) for k, v in inputs.items()}, config)
  mask = jnp.asarray(inputs["response_mask"]) * adv_lib.informative(adv)[:, None]
  if config.whiten_advantages:
    adv = adv_lib.whiten(adv, mask)
  if config.advantage_clip is not None:
    adv = jnp.clip(adv, -config.advantage_clip, config.advantage_clip)
  return adv * mask

def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--estimator", default="grpo", choices=["grpo", "gae", "reinforce", "gigpo"])
  parser.add_argument("--quick", action="store_true", help="4 steps (make bench)")
  args = parser.parse_args()
  if args.quick:
    args.steps = 4
  config = frozenlake.get_config()
  config.adv_estimator = args.estimator
  config.drop_zero_advantage_samples = False  # the baseline's whitening counts every row
  rng = np.random.default_rng(0)
  batches = [frozenlake_like_batch(rng) for _ in range(args.steps + 1)]
  timings = {}
  for name, fn in (("bucketed", lambda b: adv_lib.compute_advantages(
      {k: jnp.asarray(v) for k, v in b.items()}, config)[0]),
                   ("exact shapes", lambda b: exact_shapes(b, config))):
    np.asarray(fn(batches[0]))  # warm-up
    start = time.perf_counter()
    for b in batches[1:]:
      np.asarray(fn(b))
    timings[name] = (time.perf_counter() - start) / args.steps * 1e3
  for b in batches[1:3]:  # the same advantages
    np.testing.assert_allclose(np.asarray(adv_lib.compute_advantages(
        {k: jnp.asarray(v) for k, v in b.items()}, config)[0]),
        np.asarray(exact_shapes(b, config)), rtol=1e-4, atol=1e-5)
  rows = np.mean([len(b["episode_ids"]) for b in batches])
  print(f"{args.estimator}, {args.steps} batches of ~{rows:.0f} step rows (sizes vary): "
        f"bucketed {timings['bucketed']:.1f} ms/step, exact shapes "
        f"{timings['exact shapes']:.1f} ms/step: ratio "
        f"{timings['exact shapes'] / timings['bucketed']:.2f}x")


if __name__ == "__main__":
  main()
