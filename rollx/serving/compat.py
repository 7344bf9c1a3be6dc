"""The one place that adapts google-jetstream 0.2.2 to current JAX and to RL serving.

1. `jax.tree_map` was removed from JAX; 0.2.2's orchestrator calls it to free each
   request's prefill result (`delete_pytree`). Without it, the first finished
   insert raises inside a driver thread. We alias it to `jax.tree.map`.
2. 0.2.2's driver threads (`JetThread`) SIGKILL the whole process on any
   exception. A rollout server must report the failure, not vanish with every
   in-flight request: we log the traceback, record the dead thread (HealthCheck
   then reports not live, so clients fail over) and let the process live.
3. Importing `jetstream.core.orchestrator` sets the root logger to DEBUG and adds
   a stdout handler, so every library's debug output (and a line per generate
   step) floods the console. We restore the root logger as it was.
4. 0.2.2's generate thread has a race: it finds a slot busy, finds no new request,
   then asserts that some slot is still busy; if the detokenize thread frees the
   last busy slot in between (the last request finished), the assertion fails and
   the thread dies. A one-server run then hangs with nothing to fail over to (seen
   in CI: `get_batch` waited forever, the server's stderr had this assertion).
   When the generate thread dies of that assertion with every slot free (so no
   request is live on it and its decode state holds nothing), we start its loop
   again: a fresh decode state, the same params holder. Versions stay right because
   the engine counts its own generate steps (RollxEngine.insert), not the loop's.

6. (memory, start-up, console) 0.2.2's orchestrator imports `token_utils`, which
   imports seqio's vocabularies for SentencePiece text tokenization, and seqio imports
   TensorFlow: 4 s and ~0.7 GB of RSS in every process that imports the server (the
   servers and the trainer), and TensorFlow's native start-up records on fd 2. rollx
   serves token ids and never tokenizes text in JetStream, so unless seqio is already
   loaded, `seqio.vocabularies` is a stand-in module whose SentencePiece vocabulary
   says so if anything tries to build one.

5. (a setting, not a bug) 0.2.2's detokenize backlog holds 8 entries: the generate
   thread may dispatch 8 steps before the detokenize thread has seen the first one's
   tokens, so a request that finished waits up to 8 steps for its answer and its slot.
   That suits long decodes; an agentic turn is a ~5-token answer an env is waiting for
   (each turn's latency is on the episode's critical path). `set_detokenize_depth`
   narrows it; the queue is built inside `Driver.__init__` with no parameter, so its
   bound is changed before the first request arrives.

7. (a setting) 0.2.2's free decode slots are a FIFO queue, and its generate thread
   takes a slot from it before it looks for a request, putting the slot back at the
   end when there is none: the free slots rotate every idle step, so which slot a
   request gets is close to random. The engine keeps a finished turn's keys/values in
   its slot for the trajectory's next turn (KV reuse), so a request should take the
   slot that holds its conversation, else the slot freed longest ago.
   `reuse_slots_least_recent_first` orders the queue that way: a slot put back unused
   keeps its place, a slot freed by a finished request goes last, and the request next
   in the generate backlog gets its conversation's slot when that one is free.

`apply()` is idempotent and must run before jetstream is imported by anything
that executes a request. tests/serving/test_serving.py fails if either patch stops being
needed (JAX regains `tree_map`, JetThread stops killing) or stops working.
"""

from __future__ import annotations

import heapq
import logging
import sys
import threading
import traceback
import types

import jax

_APPLIED = False
DEAD_THREADS: list = []  # (thread name, exception text), appended by the patched run
RESTARTS: list = []  # names of generate threads restarted after the slot race (fix 4)
SLOT_RACE = "At this point we must have some requests inserted into the slots."
_lock = threading.Lock()


def tree_map_missing() -> bool:
  return not hasattr(jax, "tree_map")


def apply() -> None:
  global _APPLIED
  with _lock:
    if _APPLIED:
      return
    if tree_map_missing():
      jax.tree_map = jax.tree.map
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    _stand_in_for_seqio()
    from jetstream.core import orchestrator
    root.setLevel(level)
    for h in root.handlers[:]:
      if h not in handlers:
        root.removeHandler(h)

    def run(self):
      target, args, kwargs = self._target, self._args, self._kwargs
      while True:
        try:
          if target is not None:
            target(*args, **kwargs)
          return
        except Exception as e:  # noqa: BLE001 - this is the crash handler
          if isinstance(e, AssertionError) and str(e) == SLOT_RACE and _all_slots_free(self, target):
            logging.warning("JetStream thread %s hit 0.2.2's free-slot race with no request "
                            "live; restarting its generate loop", self.name)
            RESTARTS.append(self.name)
            continue
          logging.error("JetStream thread %s died: %s\n%s", self.name, e, traceback.format_exc())
          DEAD_THREADS.append((self.name, f"{type(e).__name__}: {e}"))
          return

    orchestrator.JetThread.run = run
    _APPLIED = True


def _stand_in_for_seqio() -> None:
  """`seqio.vocabularies` as JetStream 0.2.2 imports it, without TensorFlow (fix 6)."""
  if "seqio" in sys.modules:
    return
  vocabularies = types.ModuleType("seqio.vocabularies")

  class Vocabulary:  # what jetstream's mock vocabulary subclasses

    def __init__(self, extra_ids: int = 0):
      self._extra_ids = extra_ids

  class SentencePieceVocabulary(Vocabulary):

    def __init__(self, *args, **kwargs):
      raise NotImplementedError(
          "rollx serves token ids and does not load seqio (rollx.serving.compat): "
          "JetStream's SentencePiece text tokenization is not available")

  vocabularies.Vocabulary, vocabularies.SentencePieceVocabulary = (Vocabulary,
                                                                   SentencePieceVocabulary)
  seqio = types.ModuleType("seqio")
  seqio.__path__, seqio.vocabularies = [], vocabularies
  sys.modules["seqio"], sys.modules["seqio.vocabularies"] = seqio, vocabularies


def set_detokenize_depth(driver, depth: int) -> None:
  """Lets `driver`'s generate threads run at most `depth` steps ahead of their
  detokenize threads (fix 5). Call it before the driver serves a request."""
  if depth < 1:
    raise ValueError(f"detokenize depth must be >= 1, got {depth}")
  for backlog in driver._detokenize_backlogs:  # pylint: disable=protected-access
    with backlog.mutex:
      backlog.maxsize = int(depth)


def _all_slots_free(thread, target) -> bool:
  """Whether `thread` is one of a Driver's generate threads (its target the Driver's
  loop for engine `idx`) and every decode slot of that engine is free."""
  driver = getattr(getattr(target, "func", None), "__self__", None)
  if thread not in getattr(driver, "_generate_threads", ()):
    return False
  idx = target.args[0]
  slots = driver._generate_slots[idx]  # pylint: disable=protected-access
  engine = driver._generate_engines[idx]  # pylint: disable=protected-access
  return slots.qsize() == engine.max_concurrent_decodes


class _LeastRecentSlots:
  """A decode-slot queue's storage (fix 7): `get` gives the slot `prefer()` names when it
  is free, else the free slot freed longest ago. `was_used(slot)` says (and forgets)
  whether a request ran in the slot since it was last taken; a slot put back unused
  keeps its place."""

  def __init__(self, slots, was_used, prefer):
    self._rank = {s: i for i, s in enumerate(slots)}
    self._heap = [(i, s) for i, s in enumerate(slots)]
    self._free = set(slots)
    self._clock = len(self._rank)
    self._was_used, self._prefer = was_used, prefer

  def put(self, slot) -> None:
    if self._was_used(slot):
      self._rank[slot], self._clock = self._clock, self._clock + 1
    self._free.add(slot)
    heapq.heappush(self._heap, (self._rank[slot], slot))

  def get(self):
    preferred = self._prefer()
    if preferred in self._free:  # its heap entry goes stale
      self._free.remove(preferred)
      return preferred
    while True:
      rank, slot = heapq.heappop(self._heap)
      if slot in self._free and self._rank[slot] == rank:  # else a stale entry
        self._free.remove(slot)
        return slot

  def __len__(self) -> int:
    return len(self._free)


def reuse_slots_least_recent_first(driver, was_used, slot_for) -> None:
  """Makes `driver`'s generate threads take, for the request next in line, the slot
  `slot_for(request)` names if it is free, else the free slot freed longest ago (fix 7).
  Call it before the driver serves a request."""
  for idx, slots in enumerate(driver._generate_slots):  # pylint: disable=protected-access
    backlog = driver._generate_backlogs[idx]  # pylint: disable=protected-access

    def prefer(backlog=backlog):
      try:  # a peek: if another request is inserted instead, it only gets this slot
        return slot_for(backlog.queue[0])
      except IndexError:
        return None

    with slots.mutex:
      pool = _LeastRecentSlots(list(slots.queue), was_used, prefer)
      # queue.Queue keeps its items through these three hooks
      slots.queue, slots._put, slots._get, slots._qsize = pool, pool.put, pool.get, pool.__len__
