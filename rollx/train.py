"""Entry point: `python -m rollx.train --config=configs/frozenlake.py [--config.KEY=VALUE ...]`.

Parses flags, validates the config once, and calls `run(config)`. Until the
training loop lands (the AgenticPipeline issue), `run` is the smoke run: it
builds every env of both env managers and plays one episode per env tag with
random well-formed actions.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Dict, List

from absl import app, flags, logging
import ml_collections
from ml_collections import config_flags
import numpy as np

import envs
from rollx import config as config_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", default=None, help_string="experiment config file, e.g. configs/frozenlake.py",
    lock_config=False)


def _fail(message: str) -> None:
  """Bad input: one line on stderr, non-zero exit, no traceback."""
  print(f"rollx.train: {message}", file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv: List[str]) -> List[str]:
  """absl's parser, with ml_collections' override errors turned into one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(str(e))
  except (AttributeError, KeyError) as e:  # --config.<key> that does not exist
    text = str(e).replace("\\", "")
    match = re.search(r"[A-Za-z_][A-Za-z0-9_]*", text)
    key = match.group(0) if match else ""
    suggestion = re.search(r'Did you mean "([^"]+)"', text)
    culprit = next((a.split("=")[0] for a in argv[1:]
                    if a.startswith("--config.") and a.split("=")[0].endswith(f".{key}")
                    or f".{key}." in a.split("=")[0]), "--config override")
    _fail(f"{culprit}: unknown config key {key!r}"
          + (f" (did you mean {suggestion.group(1)!r}?)" if suggestion else ""))
  except (TypeError, ValueError) as e:
    _fail(f"bad config override: {e}")


def load_config() -> ml_collections.ConfigDict:
  if flags.FLAGS["config"].present == 0 and _CONFIG.value is None:
    _fail("--config is required, e.g. --config=configs/frozenlake.py")
  try:
    config = _CONFIG.value
    config.keys()  # config_flags defers a failed load to first use
  except Exception as e:  # noqa: BLE001 - any error in the user's config file
    _fail(f"cannot load config file {flags.FLAGS['config'].config_filename}: "
          f"{type(e).__name__}: {e}")
  try:
    return config_lib.validate(config)
  except config_lib.ConfigError as e:
    _fail(str(e))


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
    _fail(f"unexpected arguments {argv[1:]}")
  run(load_config())


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
