"""Entry point: `python -m rollx.train --config=configs/frozenlake.py [--config.KEY=VALUE ...]`.

Parses flags, validates the config once, and calls `run(config)`. Until the
training loop lands (the AgenticPipeline issue), `run` is the smoke run: it
builds every env of both env managers and plays one episode per env tag with
random well-formed actions.
"""

from __future__ import annotations

import time
from typing import Dict, List

from absl import app, logging
import ml_collections
import numpy as np

import envs
from rollx import cli, config as config_lib

def build_envs(config: ml_collections.ConfigDict, manager: str) -> Dict[str, list]:
  """Every env of one env manager, by tag (num groups x group_size each)."""
  m = config[manager]
  built = {}
  for tag, num_groups in config_lib.groups_per_tag(m).items():
    env_type, env_config = config_lib.env_config_of(config, tag)
    built[tag] = [envs.make_env(env_type, env_config) for _ in range(num_groups * m.group_size)]
  return built


def play_random_episode(env, seed: int) -> Dict[str, float]:
  rng = np.random.default_rng(seed)
  _, info = env.reset(seed=seed)
  total, steps, done, info = 0.0, 0, False, {}
  while not done:
    _, reward, terminated, truncated, info = env.step(env.sample_valid_response(rng))
    total, steps, done = total + reward, steps + 1, terminated or truncated
  return {"reward": total, "steps": steps, "success": float(info["success"])}


def run(config: ml_collections.ConfigDict) -> None:
  start = time.time()
  played = set()
  for manager in config_lib.ENV_MANAGERS:
    built = build_envs(config, manager)
    logging.info("%s: %s", manager, {t: len(e) for t, e in built.items()})
    for tag, tag_envs in built.items():
      if tag in played or not tag_envs:
        continue
      played.add(tag)
      result = play_random_episode(tag_envs[0], config.seed)
      print(f"[{manager}] {tag}: random episode of {result['steps']} steps, "
            f"reward {result['reward']:.2f}, success {result['success']:.0f}\n"
            f"{tag_envs[0].render('text')}")
  print(f"smoke run of {config.exp_name} done in {time.time() - start:.1f}s: config valid, "
        f"{len(played)} env tag(s) played (the training loop is not built yet)")


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  run(cli.load_config())


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
