"""The rollout scheduler: tickets out to env loops, trajectories in, batches of whole groups out.

Envs are laid out group-major: group g owns env ids
`g * envs_per_group ... (g + 1) * envs_per_group - 1` where
`envs_per_group = group_size + group_size_redundancy`. Each env counts its own
episodes; an env's n-th episode is the group's generation n and uses the group's
seed for n, so every env of a group plays the same level without waiting for the
others. A generation is complete when `group_size` trajectories of it have
arrived (with redundancy, the first ones; later ones are dropped and counted).

Sync (`async_generation_ratio` = 0): `get_batch` opens a round: each env gets
the tickets the batch needs, then the loops wait (no tickets) until the next
`get_batch`; weights are synced in between, so a batch is on-policy.
Async (k > 0): the loops keep running while the trainer trains, but only on
ceil(k x groups per batch) groups at a time: what is open when a `get_batch`
returns is consumed within the next ceil(k) batches, so it is at most ceil(k)
versions stale when it is used. A loop whose group's current generation is open always goes on
(the group must complete); a new generation opens only below that bound, and
during a `get_batch` only while the open groups cannot cover the groups it still
needs (otherwise a new group could complete first, be taken, and leave an old
one to go stale). A group whose oldest trajectory is older than `version - ceil(k)`
anyway (versions skipped) is dropped at batching time and counted
(`set_version` is called by the trainer after each weight sync).

Faults: a ticket stays outstanding until its trajectory arrives. An env that
raises reports the ticket and gets the same ticket again (the episode is re-run
on a fresh env); a restarted env worker asks for tickets again and gets its envs'
outstanding ones back. A trajectory for a ticket that is not outstanding (a
duplicate) is ignored. So a finished batch loses nothing and repeats nothing.

StarPO-S filtering (`group_filter_ratio` < 1): collect enough groups, keep the
fraction with the highest reward std (groups whose members all scored the same
carry no GRPO signal).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import math
from typing import Deque, Dict, List, Optional, Tuple

import ml_collections
import numpy as np

from rollx.errors import RolloutError
from rollx.rollout.types import RolloutBatch, Ticket, Trajectory, collate

GroupKey = Tuple[int, int]  # (group_id, generation)


def level_seed(base_seed: int, stream: str, tag: str, group_id: int, generation: int) -> int:
  """Seed of a group's n-th level; `stream` separates train from validation levels."""
  digest = hashlib.sha256(f"{base_seed}/{stream}/{tag}/{group_id}/{generation}".encode())
  return int.from_bytes(digest.digest()[:4], "little") & 0x7FFFFFFF


@dataclasses.dataclass
class EnvSlot:
  env_id: int
  tag: str
  group_id: int


def groups_per_tag(manager: ml_collections.ConfigDict) -> Dict[str, int]:
  """How many env groups each tag gets: `num_groups_partition`, or an equal split
  (the remainder going to the first tags)."""
  tags = tuple(manager.tags)
  if manager.num_groups_partition is not None:
    return dict(zip(tags, (int(p) for p in manager.num_groups_partition)))
  base, extra = divmod(manager.num_env_groups, len(tags))
  return {t: base + (i < extra) for i, t in enumerate(tags)}


def env_layout(manager: ml_collections.ConfigDict) -> List[EnvSlot]:
  """Every env of an env manager: its tag and group (groups split over tags)."""
  per_group = manager.group_size + manager.get("group_size_redundancy", 0)
  slots, group = [], 0
  for tag, n in groups_per_tag(manager).items():
    for _ in range(n):
      slots += [EnvSlot(group * per_group + j, tag, group) for j in range(per_group)]
      group += 1
  return slots


class RolloutScheduler:

  def __init__(self, config: ml_collections.ConfigDict, manager: str = "train_env_manager",
               stream: Optional[str] = None):
    m = config[manager]
    self.sequence_length = int(config.sequence_length)
    self.group_size = int(m.group_size)
    self.slots = {s.env_id: s for s in env_layout(m)}
    self.num_groups = int(m.num_env_groups)
    self.filter_ratio = float(m.get("group_filter_ratio", 1.0))
    self.async_ratio = float(config.async_generation_ratio) if manager == "train_env_manager" else 0.0
    self.base_seed, self.stream = int(config.seed), stream or manager
    self.version = 0
    self._next_generation: Dict[int, int] = collections.defaultdict(int)
    self._outstanding: Dict[int, Ticket] = {}  # env_id -> ticket being played
    self._ticket_ids = 0
    self._quota: Dict[int, int] = {}  # sync mode: tickets left per env in this round
    self._collecting = self.async_ratio > 0
    self._arrived: Dict[GroupKey, List[Trajectory]] = collections.defaultdict(list)
    self._complete: Deque[GroupKey] = collections.deque()
    self._closed_keys: set = set()
    self._open_keys: set = set()  # generations started and not yet taken (async bound)
    self._batch_groups = self.num_groups  # groups the trainer's last get_batch needed
    self._pending: Optional[int] = None  # groups a running get_batch still needs
    self._stopped = False
    self._failure = ""  # set by `fail`: the rollout cannot go on (a config error)
    self._changed = asyncio.Condition()
    self.counters = collections.Counter()

  # -- env side ----------------------------------------------------------------------
  def _new_ticket(self, env_id: int) -> Ticket:
    slot = self.slots[env_id]
    n = self._next_generation[env_id]
    self._next_generation[env_id] = n + 1
    self._ticket_ids += 1
    return Ticket(env_id, slot.tag, slot.group_id, n,
                  level_seed(self.base_seed, self.stream, slot.tag, slot.group_id, n),
                  self._ticket_ids)

  def _may_start(self, env_id: int) -> bool:
    if self.async_ratio > 0:  # the bound of the module docstring
      key = (self.slots[env_id].group_id, self._next_generation[env_id])
      if key in self._open_keys or key in self._closed_keys:
        return True
      if self._pending is not None:
        return len(self._open_keys) < self._pending
      return len(self._open_keys) < math.ceil(self.async_ratio * self._batch_groups)
    return self._collecting and self._quota.get(env_id, 0) > 0

  async def next_ticket(self, env_id: int) -> Optional[Ticket]:
    if env_id not in self.slots:
      raise KeyError(f"env id {env_id} is not part of this env manager")
    async with self._changed:
      # An outstanding ticket goes out again: to a restarted worker, a reset env, or a
      # live loop whose dead predecessor's call was still waiting here and took it
      # (looked for after every wake-up too, not only on entry, or that episode would
      # never be played and its group never complete).
      await self._changed.wait_for(lambda: self._stopped or env_id in self._outstanding
                                   or self._may_start(env_id))
      if self._stopped:
        return None
      if env_id in self._outstanding:
        self.counters["reissued"] += 1
        return self._outstanding[env_id]
      if self.async_ratio == 0:
        self._quota[env_id] -= 1
      ticket = self._outstanding[env_id] = self._new_ticket(env_id)
      if (ticket.group_id, ticket.generation) not in self._closed_keys:
        self._open_keys.add((ticket.group_id, ticket.generation))
      self._changed.notify_all()  # another call waiting for this env takes it too
      return ticket

  async def put(self, trajectory: Trajectory) -> None:
    t = trajectory.ticket
    async with self._changed:
      if self._outstanding.get(t.env_id) != t:
        self.counters["duplicates_ignored"] += 1
        return
      del self._outstanding[t.env_id]
      key = (t.group_id, t.generation)
      if key in self._closed_keys:
        self.counters["dropped_redundant"] += 1
        return
      self._arrived[key].append(trajectory)
      if len(self._arrived[key]) == self.group_size:
        self._closed_keys.add(key)
        self._complete.append(key)
      self.counters["trajectories"] += 1
      self._changed.notify_all()

  async def report_error(self, ticket: Ticket, error: str) -> None:
    async with self._changed:
      self.counters["env_errors"] += 1
      self.counters[f"env_errors/{ticket.tag}"] += 1

  async def fail(self, error: str) -> None:
    """An env loop hit an error no retry can fix (its prompt does not fit, the servers
    reject its requests): get_batch raises it rather than waiting forever."""
    async with self._changed:
      self._failure = self._failure or error
      self._changed.notify_all()

  # -- trainer side ------------------------------------------------------------------
  def set_version(self, version: int) -> None:
    """The policy version the servers now hold (after a weight sync)."""
    self.version = int(version)

  def _fresh(self, key: GroupKey) -> bool:
    oldest = min(t.start_version for t in self._arrived[key])
    # a fractional k leads by part of a batch: still one version stale when used
    return oldest < 0 or self.version - oldest <= math.ceil(self.async_ratio)

  async def get_batch(self, batch_size: int) -> Tuple[RolloutBatch, Dict[str, float]]:
    """Blocks until `batch_size` trajectories in complete groups exist; returns them."""
    if batch_size % self.group_size:
      raise ValueError(f"batch_size {batch_size} is not a multiple of group_size {self.group_size}")
    wanted = batch_size // self.group_size
    needed = math.ceil(wanted / self.filter_ratio) if self.filter_ratio < 1 else wanted
    async with self._changed:
      self._batch_groups = needed
      if self.async_ratio == 0:
        # One round: every env plays the episodes this batch needs, then waits.
        rounds = math.ceil(needed / self.num_groups)
        self._quota = {env_id: rounds for env_id in self.slots}
        self._collecting = True
        self._changed.notify_all()
      groups: List[GroupKey] = []
      self._pending = needed
      self._changed.notify_all()
      while len(groups) < needed:
        await self._changed.wait_for(lambda: self._complete or self._stopped or self._failure)
        if self._failure:
          raise RolloutError(f"rollout failed: {self._failure}")
        if self._stopped:
          raise RuntimeError("rollout scheduler stopped while a batch was being collected")
        key = self._complete.popleft()
        self._open_keys.discard(key)
        if self._fresh(key):
          groups.append(key)
        else:
          self.counters["dropped_stale_groups"] += 1
          self._arrived.pop(key)
        self._pending = needed - len(groups)
        self._changed.notify_all()  # async: room for more tickets
      self._pending = None
      self._changed.notify_all()  # async: the lead may build up again
      if self.async_ratio == 0:
        self._collecting = False
        self._quota = {}
      trajectories = {k: self._arrived.pop(k) for k in groups}
    if needed > wanted:  # StarPO-S: keep the groups with the most reward spread
      spread = {k: float(np.std([t.score for t in ts])) for k, ts in trajectories.items()}
      keep = sorted(groups, key=lambda k: -spread[k])[:wanted]
      self.counters["filtered_groups"] += needed - wanted
      groups = [k for k in groups if k in keep]
    chosen = [t for k in groups for t in sorted(trajectories[k], key=lambda t: t.ticket.env_id)]
    batch = collate(chosen, self.sequence_length)
    return batch, self.metrics(chosen)

  def metrics(self, trajectories: List[Trajectory]) -> Dict[str, float]:
    out = {f"rollout/{k}": float(v) for k, v in self.counters.items()}
    out.update(episode_metrics(trajectories))
    if trajectories:
      staleness = [self.version - t.start_version for t in trajectories if t.start_version >= 0]
      if staleness:
        out["rollout/staleness_mean"] = float(np.mean(staleness))
        out["rollout/staleness_max"] = float(np.max(staleness))
    return out

  def stream_state(self) -> Dict[str, int]:
    """Where each env is in its level stream (checkpointed, so a resumed run plays
    new levels rather than replaying old ones)."""
    return {str(k): int(v) for k, v in self._next_generation.items()}

  def load_stream_state(self, state: Dict[str, int]) -> None:
    for k, v in state.items():
      self._next_generation[int(k)] = int(v)

  async def stop(self) -> None:
    async with self._changed:
      self._stopped = True
      self._changed.notify_all()

  def layout(self) -> Dict[int, Tuple[str, int]]:
    return {i: (s.tag, s.group_id) for i, s in self.slots.items()}


def episode_metrics(trajectories: List[Trajectory]) -> Dict[str, float]:
  """Per-tag success rate, score mean/max/min, episode length, invalid- and
  ineffective-action rates (per action) and truncated rate: episodes the env did not
  end (out of actions, turns or tokens). A greedy history-free policy that walks back
  and forth between two states, or into a wall, shows up there, where the success
  rate alone cannot tell it from steps into a hole; the wall shows up as ineffective
  actions too. `<tag>/action_share/<action>`: each action's share of the valid actions
  (from the transcripts): a policy leaning towards one move on every board shows there,
  where the success rate alone cannot tell it from other failures."""
  by_tag: Dict[str, List[Trajectory]] = collections.defaultdict(list)
  for t in trajectories:
    by_tag[t.ticket.tag].append(t)
  out = {}
  for tag, ts in sorted(by_tag.items()):
    scores = np.array([t.score for t in ts])
    turns = sum(t.num_turns for t in ts)
    out.update({
        f"{tag}/success": float(np.mean([t.success for t in ts])),
        f"{tag}/score_mean": float(scores.mean()),
        f"{tag}/score_max": float(scores.max()),
        f"{tag}/score_min": float(scores.min()),
        f"{tag}/episode_length": float(np.mean([t.num_turns for t in ts])),
        f"{tag}/invalid_action_rate": float(sum(t.num_invalid_actions for t in ts) / max(turns, 1)),
        f"{tag}/ineffective_action_rate": float(
            sum(t.num_ineffective_actions for t in ts) / max(turns, 1)),
        f"{tag}/truncated_rate": float(np.mean([t.finish != "terminated" for t in ts])),
        # of those, the episodes the context ran out on (sequence_length or the server's
        # max_prefill_length / max_cache_length): a budget too small for the env's
        # max_steps, which a config should fix, not the policy
        f"{tag}/out_of_context_rate": float(np.mean([t.finish == "length" for t in ts])),
        f"{tag}/response_length": float(np.mean([t.num_response_tokens / max(t.num_turns, 1)
                                                 for t in ts])),
        f"{tag}/num_episodes": float(len(ts)),
    })
    with_tools = [t for t in ts if t.tool_counts]
    if with_tools:  # the tool loop: how often the model calls tools, and what goes wrong
      calls = sum(t.tool_counts.get("calls", 0) for t in with_tools)
      out[f"{tag}/tool_calls_per_episode"] = calls / len(with_tools)
      out[f"{tag}/tool_call_turn_rate"] = float(
          sum(r["action"] == "tool_call" for t in with_tools for r in t.transcript)
          / max(sum(t.num_turns for t in with_tools), 1))
      for kind in sorted(set().union(*(t.tool_counts for t in with_tools)) - {"calls"}):
        total = sum(t.tool_counts.get(kind, 0) for t in with_tools)
        if kind.startswith("sample_break_"):  # agent programs: samples cut by history edits
          out[f"{tag}/sample_breaks_per_episode/{kind[len('sample_break_'):]}"] = total / len(ts)
        else:
          out[f"{tag}/tool_error_rate/{kind}"] = total / max(calls, 1)
    # an action counts under the kind its env named (WebShop: product / option / buy ...),
    # else under its verb (`search[query]` as `search`)
    actions = collections.Counter(turn.get("kind") or turn["action"].split("[", 1)[0]
                                  for t in ts for turn in t.transcript if turn["valid"])
    total = sum(actions.values())
    out.update({f"{tag}/action_share/{action}": count / total
                for action, count in sorted(actions.items())})
  return out
