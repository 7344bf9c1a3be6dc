"""A rollout server's generate loop: continuous batching over the engine's decode slots.

Requests come in from the gRPC coroutines (`submit`, any thread); each leaves through
`deliver` (called on the loop's thread, once per step, with every request that ended in
it). One thread drives the engine through JetStream's Engine API:

  admit   every waiting request gets a free slot: the slot that holds its conversation's
          previous turn when that one is free (KV reuse), else the slot freed longest ago;
          `engine.prefill` stages its ids, `engine.insert` gives it the slot.
  step    `engine.generate`: the step's newcomers are prefilled together, then one token
          is sampled for every slot.
  read    the tokens of the step `depth` steps back: each live request takes its token and
          behaviour log-prob, and ends at a stop id, at max_tokens, or when it was aborted
          or cancelled; `engine.finish` keeps its conversation for the next turn and its
          slot is free for the next admission.

Why rollx owns this loop instead of running JetStream 0.2.2's orchestrator `Driver`:
the Driver moves every request through four threads and three queues (prefill, transfer,
generate, detokenize), and a request's slot is held until the detokenize thread sees a
step *after* its stop id. With agentic requests (a ~30-token turn and a ~5-token answer
an env is waiting for) that path, not the model, set the rate: the loop here takes
requests straight into slots and ends them on the step of their last token, on one
thread that holds the decode state. The Engine API (prefill / insert / generate) and the
gRPC `Orchestrator` protocol (rollx.serving.server) are JetStream's, so JetStream's own
clients still work. The Driver's free slots were a FIFO queue, its request to slot
choice blind to conversations, and its generate thread had a race that killed it
(asserting a busy slot the detokenize thread had just freed); none of that exists here.

`depth` (the config's `detokenize_depth`): generate steps dispatched before a step's tokens
are read. 1 lets the device run step t + 1 while the host reads step t (a finished request
then leaves one step of its slot unused); 0 reads each step before dispatching the next.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import threading
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from rollx.serving.engine import RollxEngine, Sampling, prefill_bucket


@dataclasses.dataclass(eq=False)
class Request:
  """One generation: its prompt ids and limits in; its tokens, their behaviour log-probs
  and versions out. The engine reads `sampling`, `request_id`, `mode` and
  `trajectory_id`, and writes `first_step`, `slot` and `prefill_version`."""
  prompt: np.ndarray  # [n] int32
  max_tokens: int
  sampling: Sampling
  request_id: str = ""
  trajectory_id: str = ""  # the conversation it continues ("": none)
  mode: str = "train"  # its sampling mode (a key of the engine's `sampling`)
  handle: Any = None  # the submitter's (e.g. the future its coroutine waits on)
  # -- set while it runs ------------------------------------------------------------
  slot: Optional[int] = None
  first_step: Optional[int] = None  # the generate step that samples its first token
  prefill_version: Optional[int] = None
  token_ids: List[int] = dataclasses.field(default_factory=list)
  behaviour_logp: List[float] = dataclasses.field(default_factory=list)
  token_versions: List[int] = dataclasses.field(default_factory=list)
  aborted: bool = False  # ended by a weight update (the client resubmits it)
  cancelled: bool = False  # its caller went away
  error: Optional[str] = None  # the loop died under it
  ended: bool = False


class GenerateLoopDied(RuntimeError):
  """The generate loop raised; every request it held ended with this error."""


class _LeastRecentSlots:
  """Free decode slots: `take(preferred)` gives `preferred` when it is free, else the slot
  freed longest ago (a slot keeps a finished conversation's keys/values until it is given
  to another request, so the oldest is the least likely to be continued)."""

  def __init__(self, n: int):
    self._rank = list(range(n))
    self._heap = [(i, i) for i in range(n)]
    self._free = set(range(n))
    self._clock = n
    self._first = 0  # ranks below every freed slot's, for `put_first`

  def __len__(self) -> int:
    return len(self._free)

  def __contains__(self, slot) -> bool:
    return slot in self._free

  def put(self, slot: int) -> None:
    self._rank[slot], self._clock = self._clock, self._clock + 1
    self._free.add(slot)
    heapq.heappush(self._heap, (self._rank[slot], slot))

  def put_first(self, slot: int) -> None:
    """A free slot whose keys/values nobody will continue: the next to be given away."""
    if slot in self._free:
      self._first -= 1
      self._rank[slot] = self._first
      heapq.heappush(self._heap, (self._first, slot))

  def take(self, preferred: Optional[int] = None) -> int:
    if preferred is not None and preferred in self._free:
      self._free.remove(preferred)  # its heap entry goes stale
      return preferred
    while True:
      rank, slot = heapq.heappop(self._heap)
      if slot in self._free and self._rank[slot] == rank:  # else a stale entry
        self._free.remove(slot)
        return slot


class GenerateLoop:
  """Runs `engine` on its own thread (see the module doc)."""

  def __init__(self, engine: RollxEngine, deliver: Callable[[Sequence[Request]], None],
               depth: int = 1):
    if depth < 0:
      raise ValueError(f"depth (generate steps ahead of the reads) must be >= 0, got {depth}")
    self.engine, self._deliver, self.depth = engine, deliver, int(depth)
    self._incoming: "collections.deque[Request]" = collections.deque()
    self._ended_trajectories: "collections.deque[str]" = collections.deque()
    self._waiting: List[Request] = []
    self._live: Dict[int, Request] = {}  # slot -> request
    self._free = _LeastRecentSlots(engine.max_concurrent_decodes)
    self._stops = set(engine.stop_token_ids)
    self._wake = threading.Event()
    self._stopping = False
    self._lock = threading.Lock()  # guards `_requests` (submit / abort vs the loop)
    self._requests: Dict[int, Request] = {}  # every request not yet ended, by id()
    self.error: Optional[str] = None
    self._thread = threading.Thread(target=self._run, daemon=True, name="rollx-generate")
    self._thread.start()

  # -- any thread --------------------------------------------------------------------
  def submit(self, request: Request) -> None:
    with self._lock:  # (the crash handler takes it too: a request is refused or delivered)
      if self.error is not None:
        raise GenerateLoopDied(self.error)
      self._requests[id(request)] = request
    self._incoming.append(request)
    self._wake.set()

  def requests(self) -> List[Request]:
    """The requests submitted and not yet ended (waiting or in a slot)."""
    with self._lock:
      return list(self._requests.values())

  def abort_all(self) -> int:
    """Ends every request not yet ended at the loop's next step, marked `aborted`
    (ROLL's abort at weight sync: the client resubmits them under the new weights)."""
    requests = self.requests()
    for r in requests:
      r.aborted = True
    self._wake.set()
    return len(requests)

  def end_trajectory(self, trajectory_id: str) -> None:
    """The trajectory ended: the engine drops its keys/values, and the slot that held them
    is the next to be given away (processed on the loop's thread, before the next
    admission)."""
    self._ended_trajectories.append(trajectory_id)
    self._wake.set()

  def cancel(self, request: Request) -> None:
    """Its caller went away: the loop frees its slot at the next step."""
    if not request.ended:
      request.cancelled = True
      self._wake.set()

  @property
  def alive(self) -> bool:
    return self.error is None and self._thread.is_alive()

  def stop(self) -> None:
    self._stopping = True
    self._wake.set()
    self._thread.join(timeout=10)

  # -- the loop's thread -----------------------------------------------------------------
  def _run(self) -> None:
    try:
      self._serve()
    except Exception as e:  # noqa: BLE001 - the loop's crash handler
      logging.error("rollx generate loop died: %s: %s\n%s", type(e).__name__, e,
                    traceback.format_exc())
      with self._lock:
        self.error = f"{type(e).__name__}: {e}"
        dead = list(self._requests.values())
        self._requests.clear()
      for r in dead:
        r.error, r.ended = self.error, True
      if dead:
        self._deliver(dead)

  def _serve(self) -> None:
    engine = self.engine
    state = engine.init_decode_state()
    unread: "collections.deque" = collections.deque()  # (step output, [(slot, request)])
    while not self._stopping:
      ended: List[Request] = []
      state = self._admit(state, ended)
      if not self._live:
        while unread:
          self._read(*unread.popleft(), ended)
        self._finish(ended)
        if not self._live and not self._incoming and not self._ended_trajectories:
          self._wake.wait()
          self._wake.clear()
        continue
      state, result = engine.generate(engine.params_holder, state)
      unread.append((result.data, list(self._live.items())))
      while len(unread) > self.depth:
        self._read(*unread.popleft(), ended)
      self._finish(ended)

  def _admit(self, state, ended: List[Request]):
    """Gives waiting requests free slots: first every request whose conversation's slot
    is free takes it, then the rest, in arrival order, the slots freed longest ago."""
    while self._ended_trajectories:
      slot = self.engine.end_trajectory(self._ended_trajectories.popleft())
      if slot is not None:
        self._free.put_first(slot)
    while self._incoming:
      self._waiting.append(self._incoming.popleft())
    if not self._waiting:
      return state
    waiting, self._waiting = self._waiting, []
    placed: Dict[int, Request] = {}
    for r in waiting:
      if r.aborted or r.cancelled:
        ended.append(r)
        continue
      slot = self.engine.slot_for(r) if r.trajectory_id else None
      if slot is not None and slot in self._free:
        placed[self._free.take(slot)] = r
      else:
        self._waiting.append(r)
    rest, self._waiting = self._waiting, []
    for r in rest:
      if len(self._free):
        placed[self._free.take()] = r
      else:
        self._waiting.append(r)
    engine = self.engine
    for slot, r in placed.items():
      padded = np.zeros((prefill_bucket(len(r.prompt)),), np.int32)
      padded[:len(r.prompt)] = r.prompt
      prefix = engine.prefill(params=engine.params_holder, padded_tokens=padded,
                              true_length=len(r.prompt))
      prefix.request = r
      state = engine.insert(prefix, state, slot)
      self._live[slot] = r
    return state

  def _read(self, data, live: Sequence, ended: List[Request]) -> None:
    """One step's tokens for the requests that were in its slots."""
    data = np.asarray(data)  # waits for the step: [slots, (token, valid, length, logp bits)]
    logp = data[:, 3].view(np.float32)
    for slot, r in live:
      if r.ended:
        continue
      if not (r.aborted or r.cancelled):
        token = int(data[slot, 0])
        r.token_ids.append(token)
        r.behaviour_logp.append(float(logp[slot]))
        if token not in self._stops and len(r.token_ids) < r.max_tokens:
          continue
      self._end(r, ended)

  def _end(self, r: Request, ended: List[Request]) -> None:
    r.ended = True
    del self._live[r.slot]
    if not (r.aborted or r.cancelled):
      r.token_versions = self.engine.versions_of(r.first_step, len(r.token_ids))
      # before its slot is given to anyone: the next turn may continue from it
      self.engine.finish(r, r.token_ids)
    self.engine.release_slot(r.slot)
    self._free.put(r.slot)
    ended.append(r)

  def _finish(self, ended: List[Request]) -> None:
    if not ended:
      return
    with self._lock:
      for r in ended:
        r.ended = True
        self._requests.pop(id(r), None)
    self._deliver(ended)

