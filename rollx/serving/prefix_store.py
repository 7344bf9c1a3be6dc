"""The prefix store of rollx's serving engine: finished conversations whose slots went to
other requests, kept in a pool of fixed-size KV blocks beside the slots (least recently
used conversation evicted first), so that a server keeps more conversations than it has
slots. This is the host-side allocator (which blocks hold which trajectory); the pool
itself and the copies in and out of it are `rollx.serving.slot_ops.store_slot` and
`load_slot`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, List, Optional, Sequence

import numpy as np

# Tokens per block of the prefix store: a conversation takes ceil(ids / block) blocks.
PREFIX_BLOCK = 64


@dataclasses.dataclass
class Stored:
  """A finished conversation moved out of its slot into the store's blocks."""
  conversation: Any  # has `trajectory_id` and `ids`
  blocks: List[int]


class PrefixStore:
  """Trajectory -> its blocks, least recently used first, and the free blocks.

  Not locked: the engine calls it under the lock that also guards its slots' conversations.
  A popped entry's blocks stay taken until `release`: the engine frees them only once the
  copy out of them is dispatched, so a later store into them runs after it.
  """

  def __init__(self, tokens: int, max_cache_length: int):
    self.blocks_per_slot = -(-int(max_cache_length) // PREFIX_BLOCK)
    self.num_blocks = int(tokens) // PREFIX_BLOCK
    self._entries: "collections.OrderedDict[str, Stored]" = collections.OrderedDict()
    self._free: List[int] = list(range(self.num_blocks))
    self.evictions = 0  # conversations evicted for room

  def keep(self, conversation) -> Optional[Stored]:
    """Blocks for `conversation` (evicting the least recently used entries as needed),
    or None when the store is off or too small for it."""
    need = -(-len(conversation.ids) // PREFIX_BLOCK)
    if need > self.num_blocks:
      return None
    while len(self._free) < need:
      if not self._entries:  # (the blocks a turn is being copied back from are not free yet)
        return None
      _, old = self._entries.popitem(last=False)
      self._free.extend(old.blocks)
      self.evictions += 1
    blocks, self._free = self._free[:need], self._free[need:]
    entry = self._entries[conversation.trajectory_id] = Stored(conversation, blocks)
    return entry

  def pop(self, trajectory: str) -> Optional[Stored]:
    """`trajectory`'s entry, out of the store; its blocks stay taken until `release`."""
    return self._entries.pop(trajectory, None)

  def release(self, blocks: Sequence[int]) -> None:
    self._free.extend(blocks)

  def clear(self) -> None:
    self._entries.clear()
    self._free = list(range(self.num_blocks))

  @property
  def tokens(self) -> int:
    """Ids whose keys/values the store holds."""
    return sum(len(e.conversation.ids) for e in self._entries.values())

  def block_array(self, blocks: Sequence[int]) -> np.ndarray:
    """`blocks` as a slot's `[blocks per slot]` index row, padded past the pool (dropped)."""
    out = np.full((self.blocks_per_slot,), self.num_blocks, np.int32)
    out[:len(blocks)] = blocks
    return out
