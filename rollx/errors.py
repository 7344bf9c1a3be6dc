"""The errors that end a run with one line: a bad setting (ConfigError, naming the config
key) and a rollout that cannot go on (RolloutError, naming the env and the server).

Lower layers (mesh, partition rules, the engine) raise them without importing the
config module, which sits above them.
"""

from __future__ import annotations

from typing import Sequence, Tuple


class ConfigError(ValueError):
  """One or more config problems; `errors` is a list of (dotted_key, message)."""

  def __init__(self, errors: Sequence[Tuple[str, str]]):
    self.errors = list(errors)
    super().__init__("; ".join(f"config.{k}: {m}" for k, m in self.errors))

  @property
  def key(self) -> str:
    return self.errors[0][0]


class RolloutError(RuntimeError):
  """The rollout cannot go on (every server down past its restart timeout, a prompt
  that never fits, a request the servers reject): get_batch raises it; the message
  names the env and the cause."""
