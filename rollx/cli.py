"""What every entry point shares: the --config flag, one-line errors for bad input and a
console without library chatter (`quiet_console`)."""

from __future__ import annotations

import logging as std_logging
import os
import re
import sys
from typing import List

from absl import flags, logging
import ml_collections
from ml_collections import config_flags

from rollx import checks
from rollx.errors import ConfigError

CONFIG = config_flags.DEFINE_config_file(
    "config", default=None, help_string="experiment config file, e.g. configs/frozenlake.py",
    lock_config=False)


def fail(message: str) -> None:
  """Bad input: one line on stderr, exit status 2, no traceback."""
  name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
  print(f"rollx.{name}: {message}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv: List[str]) -> List[str]:
  """absl's parser, with ml_collections' override errors turned into one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    text = str(e)
    if "Traceback (most recent call last)" in text:
      # config_flags embeds the config file's traceback (get_config raised, e.g. on a
      # bad `path:arg`): its first line names the flag, its last the error
      lines = [line for line in text.splitlines() if line.strip()]
      text = f"{lines[0].strip()} {lines[-1].strip()}"
    fail(text)
  except (AttributeError, KeyError) as e:  # --config.<key> that does not exist
    text = str(e).replace("\\", "")
    match = re.search(r"[A-Za-z_][A-Za-z0-9_]*", text)
    key = match.group(0) if match else ""
    suggestion = re.search(r'Did you mean "([^"]+)"', text)
    culprit = next((a.split("=")[0] for a in argv[1:]
                    if a.startswith("--config.") and a.split("=")[0].endswith(f".{key}")
                    or f".{key}." in a.split("=")[0]), "--config override")
    fail(f"{culprit}: unknown config key {key!r}"
         + (f" (did you mean {suggestion.group(1)!r}?)" if suggestion else ""))
  except (TypeError, ValueError) as e:
    fail(f"bad config override: {e}")


def load_config() -> ml_collections.ConfigDict:
  """The validated --config; any problem exits with one line naming the culprit."""
  if CONFIG.value is None:
    fail("--config is required, e.g. --config=configs/frozenlake.py")
  try:
    config = CONFIG.value
    config.keys()  # config_flags defers a failed load to first use
  except Exception as e:  # noqa: BLE001 - any error in the user's config file
    fail(f"cannot load config file {flags.FLAGS['config'].config_filename}: "
         f"{type(e).__name__}: {e}")
  try:
    return checks.validate(config)
  except ConfigError as e:
    fail(str(e))


def quiet_console() -> None:
  """Keeps what the libraries say at INFO off the console (an entry point calls it after
  flag parsing, before Ray or JetStream are imported); --verbosity=0 brings it back.

  - absl's records (Orbax logs every checkpoint at INFO): level WARNING.
  - Ray's driver logger ("Started a local Ray instance"): RAY_LOGGER_LEVEL=warning, read
    when ray is imported. The actors' output stays off the console (cluster.init_ray:
    log_to_driver=False).
  - Ray's notice, at WARNING, that a new local cluster has token authentication on (its
    default; not a problem to act on): that one logger at ERROR.
  - What C++ code writes to stderr itself is filtered where it happens (rollx.console):
    Ray's notice about restartable actors' constructor arguments while rollx.cluster
    starts the env workers.
  RAY_LOGGER_LEVEL already in the environment is kept.
  """
  if flags.FLAGS["verbosity"].present and flags.FLAGS["verbosity"].value >= 0:
    return  # (absl.app's default verbosity is INFO: only a given flag counts)
  logging.set_verbosity(logging.WARNING)  # rollx.console's filters follow it
  os.environ.setdefault("RAY_LOGGER_LEVEL", "warning")
  std_logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
      std_logging.ERROR)
