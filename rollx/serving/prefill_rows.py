"""How rollx's serving engine packs the prompts staged for a generate step into the numpy
arguments of its prefill and extend calls (`rollx.serving.slot_ops.prefill_into_slots`,
`extend_into_slots`): calls of one bucket width each, a bounded number of rows per call,
unused rows aimed past the last slot so that the slot ops drop them.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

# Attention keys per prefill call at most (rows x keys per row; `PrefillRows.rows`): 8
# rows of up to 1024 tokens, fewer for longer buckets and for continuations (whose
# queries also attend to the slot's cache). Measured on configs/sokoban.py:multiturn
# (4096-token buckets, the default model): prefills of 2 rows instead of 8 took the
# server's peak RSS from 4.5 to 3.3 GB, continuations of 1 row instead of 2 from 2.7 to
# 1.8 GB (with rollx.serving.compat keeping TensorFlow out).
PREFILL_TOKENS = 8192


class PrefillRows:
  """Rows for an engine's prefill / extend calls. A staged prompt has `slot`, `prefix`
  (`tokens` padded to a bucket, `true_length`), `sampling`, `seed` and `start` (> 0: its
  slot already holds the keys/values of ids [0, start), only the rest is prefilled).

  Numpy, not jnp: an eager jnp op is a dispatch of its own, queued behind the running step.
  """

  def __init__(self, slots: int, prefill_batch: int, max_cache_length: int, pad_id: int):
    self.slots, self.prefill_batch = slots, prefill_batch
    self.max_cache_length, self.pad_id = max_cache_length, pad_id

  def rows(self, width: int, extend: bool = False) -> int:
    """Rows per call of this width: `prefill_batch`, fewer for long prompts (at most
    PREFILL_TOKENS keys a call: a call's activations and attention scores, not the
    weights, set a server's peak memory; a continuation's queries also attend to its
    slot's whole cache)."""
    keys = width + (self.max_cache_length if extend else 0)
    return max(1, min(self.prefill_batch, PREFILL_TOKENS // keys))

  def chunks(self, staged: Sequence, width_of, extend: bool = False):
    """`staged` in calls of one width each, `rows(width)` rows at most: (width, chunk)."""
    by_width: Dict[int, List] = {}
    for s in staged:
      by_width.setdefault(width_of(s), []).append(s)
    for width in sorted(by_width):
      group, n = by_width[width], self.rows(width, extend)
      for i in range(0, len(group), n):
        yield width, group[i:i + n]

  def prefill(self, width: int, chunk: Sequence):
    """Whole prompts as `rows(width)` rows: tokens, true length, slot, sampling."""
    n = self.rows(width)
    tokens = np.full((n, width), self.pad_id, np.int32)
    true_length = np.ones((n,), np.int32)
    slot = np.full((n,), self.slots, np.int32)
    for i, s in enumerate(chunk):
      tokens[i, :len(s.prefix.tokens)] = s.prefix.tokens
      true_length[i], slot[i] = s.prefix.true_length, s.slot
    return (tokens, true_length, slot) + self._sampling(n, chunk)

  def extend(self, width: int, chunk: Sequence):
    """Continuations as `rows(width, extend=True)` rows: their new ids (padded to
    `width`), where they start, how many, their slot, sampling."""
    n = self.rows(width, extend=True)
    tokens = np.full((n, width), self.pad_id, np.int32)
    start, length = np.zeros((n,), np.int32), np.ones((n,), np.int32)
    slot = np.full((n,), self.slots, np.int32)
    for i, s in enumerate(chunk):
      new = s.prefix.tokens[s.start:s.prefix.true_length]
      tokens[i, :len(new)] = new
      start[i], length[i], slot[i] = s.start, len(new), s.slot
    return (tokens, start, length, slot) + self._sampling(n, chunk)

  @staticmethod
  def _sampling(n: int, chunk: Sequence):
    """Per row: temperature, top-p, top-k, the request's sampling seed (padding: off)."""
    temp, top_p = np.ones((n,), np.float32), np.ones((n,), np.float32)
    top_k, seed = np.zeros((n,), np.int32), np.zeros((n,), np.uint32)
    for i, s in enumerate(chunk):
      temp[i], top_p[i], top_k[i] = s.sampling.temperature, s.sampling.top_p, s.sampling.top_k
      seed[i] = s.seed
    return temp, top_p, top_k, seed
