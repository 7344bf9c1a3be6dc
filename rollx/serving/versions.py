"""The weights a rollx serving engine serves and the weights version each of its generate
steps used: from these a response reports the version of every token it contains, and
KV reuse tells whether cached keys/values came from the weights about to sample.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any, List, Optional, Tuple

import numpy as np


class VersionedParams:
  """The weights an engine serves: (version, params), swapped atomically."""

  def __init__(self, params, version: int = 0):
    self._lock = threading.Lock()
    self._current = (int(version), params)

  def get(self) -> Tuple[int, Any]:
    with self._lock:
      return self._current

  def set(self, params, version: int) -> None:
    with self._lock:
      self._current = (int(version), params)

  @property
  def version(self) -> int:
    return self.get()[0]


class StepVersions:
  """The version of every generate step, stored as change points (first step, version):
  versions change once per weight sync, steps run forever."""

  def __init__(self):
    self.num_steps = 0
    self._starts: List[int] = []
    self._versions: List[int] = []

  def record(self, version: int) -> None:
    """Generate step `num_steps` ran with `version`."""
    if not self._versions or self._versions[-1] != version:
      self._starts.append(self.num_steps)
      self._versions.append(version)
    self.num_steps += 1

  def at(self, step: int) -> int:
    return self._versions[bisect.bisect_right(self._starts, step) - 1]

  def of_tokens(self, first_step: Optional[int], num_tokens: int) -> List[int]:
    """Policy version of each of a request's tokens: the weights whose logits it was
    sampled from. Step t samples token t - first_step from the logits of the step
    before (its decode step), except the first token, sampled from its prefill at
    `first_step`: after a weight swap at step t, token t still comes from the old
    weights."""
    if first_step is None or num_tokens == 0:
      return []
    return [self.at(first_step)] + [
        self.at(t - 1) for t in range(first_step + 1, first_step + num_tokens)]

  def of_keys_values(self, first_step: Optional[int], num_tokens: int) -> np.ndarray:
    """The weights version that computed each response token's keys/values: token i is
    fed through the model by the step after the one that sampled it (first_step + i + 1;
    the current weights when that step has not run yet)."""
    if first_step is None or not self._versions:
      return np.full(num_tokens, -1, np.int32)
    return np.array([self.at(t) if t < self.num_steps else self._versions[-1]
                     for t in range(first_step + 1, first_step + num_tokens + 1)], np.int32)

  def unchanged_since(self, step: int, version: int) -> bool:
    """Whether every generate step from `step` on, and the one about to run with
    `version`, used the same weights (a reused key/value is exact only then)."""
    return not self._versions or (self._versions[-1] == version and self._starts[-1] <= step)
