"""What every area's config checks share: the error collector (`Checker`), the type
test that also normalises (int->float, list->tuple) and the did-you-mean hint.

It imports nothing from rollx, so the modules that own an area (mesh, serving, env
manager, ...) can check their keys without importing the config module's callers.
"""

from __future__ import annotations

import difflib
from typing import Any, List, Sequence, Tuple


def type_name(t) -> str:
  return t.__name__ if isinstance(t, type) else " or ".join(x.__name__ for x in t)


def check_type(value, expected) -> Tuple[bool, Any]:
  """Whether `value` fits type `expected`; also returns it normalised (int->float, list->tuple)."""
  if isinstance(expected, tuple):
    return any(check_type(value, t)[0] for t in expected), value
  if expected is bool:
    return isinstance(value, bool), value
  if expected is int:
    return isinstance(value, int) and not isinstance(value, bool), value
  if expected is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ok, float(value) if ok else value
  if expected is tuple:
    ok = isinstance(value, (tuple, list))
    return ok, tuple(value) if ok else value
  return isinstance(value, expected), value


def is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def did_you_mean(key: str, options) -> str:
  close = difflib.get_close_matches(key, list(options), n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


class Checker:
  """Collects (dotted_key, message) pairs, so that one run reports every problem."""

  def __init__(self):
    self.errors: List[Tuple[str, str]] = []

  def error(self, key: str, message: str):
    self.errors.append((key, message))

  def rule(self, ok: bool, key: str, message: str):
    if not ok:
      self.error(key, message)

  def choice(self, cfg, key: str, path: str, options: Sequence[str]):
    value = cfg.get(key)
    if isinstance(value, str) and value not in options:
      self.error(path, f"{value!r} is not one of {', '.join(options)}"
                 f"{did_you_mean(value, options)}")
