"""The error every layer raises for a bad setting: it names the config key.

Lower layers (mesh, partition rules, the engine) raise it without importing the
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
