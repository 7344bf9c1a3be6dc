"""WebShop env speed (search included), and the reference policies' scores.

    python bench/webshop_env.py [--episodes 1000]
    python bench/webshop_env.py --quick    # `make bench`: 200 episodes

Prints, on the synthetic catalog (3,000 products) and its validation instructions, with
WebShop's 10 results a page and 15 actions, then configs/webshop.py's 3 and 8:
- env steps/s of the env alone under a uniformly random valid-action policy (search
  pages, result pages, item pages, purchases);
- the mean reward and success of that random policy, of a random shopper that keeps
  the shop's procedure with random choices (envs.webshop.shopper_response, an optional
  stage of the WebShop start's recipe), of a policy that copies words
  without knowing which matter (`copy_response`), of one that copies all of them into
  its search (`copy_response(whole=True)`), and of an oracle that reads the goal
  (envs.webshop.oracle_response): the floor, two rungs and the ceiling of a learning
  curve;
- search queries/s through the BM25 index (bm25s) vs the same BM25 scoring as a plain
  Python scan over every product, in the same process: the ratio is the index's gain.
"""

import argparse
import collections
import math
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import envs  # noqa: E402
from envs import webshop  # noqa: E402


def copy_response(env, rng, whole=False):
  """What a policy that only copies words can do, without knowing which matter: search
  three consecutive words among the instruction's first eight (`whole`: the whole
  instruction), open the first result, choose each option whose value the instruction
  names, buy."""
  if env.page == "search":
    words = env.goal.instruction.split()
    start = int(rng.integers(0, 6))  # the last start whose three words are among the first 8
    query = " ".join(words if whole else words[start:start + 3])
    return f"<answer>search[{query}]</answer>"
  if env.page == "results":
    page = env._page_asins()
    return f"<answer>click[{page[0] if page else webshop.BACK_TO_SEARCH}]</answer>"
  if env.page == "item":
    instruction = f" {re.sub(r'[^a-z0-9. ]', ' ', env.goal.instruction.lower())} "
    for group, values in env.product.options.items():
      named = [v for v in values if f" {v.lower()} " in instruction]
      if group not in env.chosen and named:
        return f"<answer>click[{named[0]}]</answer>"
    return f"<answer>click[{webshop.BUY_NOW}]</answer>"
  return f"<answer>click[{webshop.PREV_PAGE}]</answer>"


def play(env, policy, episodes, rng):
  rewards, successes, steps = [], [], 0
  for seed in range(episodes):
    env.reset(seed=seed)
    while True:
      response = (webshop.oracle_response(env) if policy == "oracle"
                  else copy_response(env, rng) if policy == "copy"
                  else copy_response(env, rng, whole=True) if policy == "copy_all"
                  else webshop.shopper_response(env, rng) if policy == "shopper"
                  else env.sample_valid_response(rng))
      _, reward, terminated, truncated, info = env.step(response)
      steps += 1
      if terminated or truncated:
        rewards.append(reward if terminated else 0.0)
        successes.append(info["success"])
        break
  return float(np.mean(rewards)), float(np.mean(successes)), steps


class ScanBM25:
  """BM25 (k1 1.5, b 0.75, as bm25s's default) scored product by product in Python."""

  def __init__(self, texts, k1=1.5, b=0.75):
    self.docs = [collections.Counter(re.findall(r"\w\w+", t.lower())) for t in texts]
    self.lengths = [sum(d.values()) for d in self.docs]
    self.avg = sum(self.lengths) / len(self.docs)
    df = collections.Counter(w for d in self.docs for w in d)
    n = len(self.docs)
    self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}
    self.k1, self.b = k1, b

  def search(self, query, k):
    words = re.findall(r"\w\w+", query.lower())
    scores = []
    for i, (d, length) in enumerate(zip(self.docs, self.lengths)):
      s = 0.0
      for w in words:
        tf = d.get(w, 0)
        if tf:
          s += self.idf[w] * tf * (self.k1 + 1) / (
              tf + self.k1 * (1 - self.b + self.b * length / self.avg))
      scores.append((s, i))
    return [i for s, i in sorted(scores, reverse=True)[:k] if s > 0]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--episodes", type=int, default=1000)
  parser.add_argument("--quick", action="store_true", help="200 episodes (make bench)")
  args = parser.parse_args()
  if args.quick:
    args.episodes = 200
  # WebShop's page size and step budget, then configs/webshop.py's
  for setting in ({}, {"results_per_page": 3, "max_steps": 8}):
    env = envs.make_env("WebShop", {"split": "validation", **setting})
    env.catalog.search("warm up the index")
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    reward, success, steps = play(env, "random", args.episodes, rng)
    rate = steps / (time.perf_counter() - start)
    name = f"{env.config.results_per_page} results a page, {env.config.max_steps} actions"
    print(f"[{name}] random valid actions: {rate:,.0f} env steps/s (search included), mean "
          f"reward {reward:.3f}, success {success:.3f} over {args.episodes} validation episodes")
    reward, success, _ = play(env, "shopper", args.episodes, np.random.default_rng(0))
    print(f"[{name}] a random shopper (a random span searched, a random result, a random "
          f"value per option group, buy): mean reward {reward:.3f}, success {success:.3f}")
    reward, success, _ = play(env, "copy", args.episodes, rng)
    print(f"[{name}] copying words (3 of the instruction's first 8 searched, first result, "
          f"the options it names): mean reward {reward:.3f}, success {success:.3f}")
    reward, success, _ = play(env, "copy_all", args.episodes, rng)
    print(f"[{name}] copying the whole instruction into the search (then as above): "
          f"mean reward {reward:.3f}, success {success:.3f}")
    reward, success, _ = play(env, "oracle", args.episodes, rng)
    print(f"[{name}] oracle: mean reward {reward:.3f}, success {success:.3f}")
  queries = [g.instruction for g in env.catalog.validation_goals][:max(args.episodes // 4, 20)]
  start = time.perf_counter()
  for q in queries:
    env.catalog.search(q)
  index = len(queries) / (time.perf_counter() - start)
  scan = ScanBM25([p.text() for p in env.catalog.products])
  start = time.perf_counter()
  for q in queries:
    scan.search(q, 50)
  plain = len(queries) / (time.perf_counter() - start)
  print(f"search, {len(env.catalog.products)} products: bm25s {index:,.0f} queries/s, "
        f"Python scan {plain:,.0f} queries/s: ratio {index / plain:.1f}x")


if __name__ == "__main__":
  main()
