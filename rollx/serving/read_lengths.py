"""How much of the KV cache a decode step reads: up to the smallest of a few length
buckets that holds every busy slot's position, not the allocation. An agent's turn of 40
tokens in a 4096-token cache then costs what its conversation holds (one compiled decode
step per bucket). The host mirrors each slot's device position exactly: prefill and
extend set it to the prompt's length, each generate step adds one (capped at the last
index, as `slot_ops.decode_slots` does); a slot is busy from `insert` until `release`.
"""

from __future__ import annotations

import bisect
from typing import Optional, Sequence, Tuple

import numpy as np

# The shortest cache read of a decode step: below it a bucket saves less than its compile.
MIN_DECODE_READ = 128


def decode_read_buckets(max_cache_length: int) -> Tuple[int, ...]:
  """The cache lengths a decode step may read: powers of two from `MIN_DECODE_READ`
  below the allocation, then the allocation itself."""
  below = [2**i for i in range(MIN_DECODE_READ.bit_length() - 1, max_cache_length.bit_length())
           if 2**i < max_cache_length]
  return (*below, max_cache_length)


class ReadLengths:
  """The host mirror of every slot's position and whether it is busy.

  `buckets` defaults to `decode_read_buckets(max_cache_length)`; `(max_cache_length,)`
  reads the whole allocation at every step (the baseline of bench/serve.py's longcache
  workload)."""

  def __init__(self, slots: int, max_cache_length: int,
               buckets: Optional[Sequence[int]] = None):
    self.buckets = tuple(buckets or decode_read_buckets(max_cache_length))
    if self.buckets[-1] != max_cache_length:
      raise ValueError(f"read buckets {self.buckets} must end at max_cache_length="
                       f"{max_cache_length}")
    self._last = max_cache_length - 1
    self._pos = np.zeros((slots,), np.int64)
    self._busy = np.zeros((slots,), bool)

  def insert(self, slot: int, length: int) -> None:
    self._pos[slot], self._busy[slot] = length, True

  def release(self, slot: int) -> None:
    self._busy[slot] = False

  def step(self) -> None:
    np.minimum(self._pos + 1, self._last, out=self._pos)

  def reset(self) -> None:
    self._pos[:], self._busy[:] = 0, False

  def bucket(self, positions: int) -> int:
    """The smallest read length holding `positions` cache positions."""
    return self.buckets[bisect.bisect_left(self.buckets, positions)]

  def up_to(self, positions: int) -> Tuple[int, ...]:
    """Every read length up to the one holding `positions` (what a warmup compiles)."""
    return self.buckets[:bisect.bisect_left(self.buckets, positions) + 1]

  @property
  def decode(self) -> int:
    """The read length of the next decode step."""
    return self.bucket(int(self._pos[self._busy].max()) if self._busy.any() else 0)
