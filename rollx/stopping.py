"""Clean stops: SIGINT (Ctrl-C) and SIGTERM (a batch scheduler, a preempted spot VM) end a
training run at its last finished step, saved as a planned checkpoint is.

One process: the first signal asks the run to stop. A rollout being collected is
abandoned (`check`, polled by the trainer while it waits for a batch): its episodes are
not trained on, and the checkpoint records where the level streams stood before it. A
learner update under way finishes: its input state was donated into the jitted step, so
the update's result is the only state left to save. The pipeline then saves, shuts down
servers, env workers and Ray, and raises `Stopped`. A second signal ends the process at
once, without a checkpoint, and takes its child processes (Ray's daemons) with it.

Several JAX processes (a multi-host run) must all save the same step, and a follower
cannot leave a collective that process 0 has left, so there stops happen at step ends
only: SIGTERM is left to JAX, whose preemption notifier makes every process see
`reached_preemption_sync_point` at the same step (as MaxText does on preemptible TPU
VMs), and a SIGINT on any process is seen by all through one all-gather a step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Iterator, Optional

import jax
import numpy as np

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(Exception):
  """Raised inside a step (one process) when a stop signal came: the step is dropped."""


class Stopped(Exception):
  """The run stopped on a signal after saving its last finished step."""

  def __init__(self, signum: int, step: Optional[int], checkpoint: Optional[str]):
    self.signum, self.step, self.checkpoint = signum, step, checkpoint
    self.signame = signal.Signals(signum).name
    super().__init__(f"stopped by {self.signame} at step {step}")


class _Handler:
  """The installed handlers of one run and the first signal they saw."""

  def __init__(self, multihost: bool, immediate: bool):
    self.multihost, self.immediate = multihost, immediate
    self.requested: Optional[int] = None
    self.previous = {}
    # multi-host: SIGTERM stays with JAX's preemption notifier
    self.signals = (signal.SIGINT,) if multihost else SIGNALS

  def __call__(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    global _last
    if self.requested is None:
      self.requested = _last = signum
      if self.immediate:  # nothing to save yet (the run is starting): stop now
        raise StopRequested()
      print(f"{name}: stopping after saving the last finished step (again to stop at once, "
            "without saving)", file=sys.stderr, flush=True)
      return
    print(f"{name} again: stopped at once, nothing saved", file=sys.stderr, flush=True)
    _kill_descendants(os.getpid())
    os._exit(128 + signum)

  def install(self) -> None:
    for s in self.signals:
      self.previous[s] = signal.signal(s, self)

  def uninstall(self) -> None:
    for s, handler in self.previous.items():
      signal.signal(s, handler)


_active: Optional[_Handler] = None
_last: Optional[int] = None  # the first stop signal of this process


@contextlib.contextmanager
def on_signals(immediate: bool = False) -> Iterator[None]:
  """SIGINT and SIGTERM handled as stop requests while the block runs: noted, for the run
  to stop at the next point it can save; `immediate`: StopRequested raised at once (a
  run starting, with nothing to save). Nested blocks share the outer one's handlers.
  Python runs signal handlers in the main thread: elsewhere nothing is installed."""
  global _active
  import threading
  if _active is not None:
    # again: libraries started since (Ray's core worker) put their own handlers in
    for s in _active.signals:
      signal.signal(s, _active)
    outer, _active.immediate = _active.immediate, immediate
    try:
      yield
    finally:
      _active.immediate = outer
    return
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  # not jax.process_count(): that starts the backend, which must come after Ray's forks
  handler = _Handler(jax.distributed.is_initialized(), immediate)
  # installed after the runtime's own (XLA's failure handlers dump stacks on SIGTERM)
  handler.install()
  _active = handler
  try:
    yield
  finally:
    _active = None
    handler.uninstall()


def check() -> None:
  """Raises StopRequested when a stop signal came and a step may be dropped now."""
  if _active is not None and _active.requested is not None and not _active.multihost:
    raise StopRequested()


def requested() -> Optional[int]:
  """The first stop signal seen, if any (this process)."""
  return None if _active is None else _active.requested


def last_signal() -> Optional[int]:
  """The first stop signal this process saw, also after its block ended."""
  return _last


def at_step_end(step: int) -> Optional[int]:
  """The signal to stop on after step `step - 1` finished, agreed by every process; None
  to go on. A collective in a multi-host run: every process calls it at every step end."""
  if _active is None:
    return None
  if not _active.multihost:
    return _active.requested
  from jax.experimental import multihost_utils
  if multihost_utils.reached_preemption_sync_point(step):
    return signal.SIGTERM
  local = np.int32(_active.requested or 0)
  seen = np.asarray(multihost_utils.process_allgather(local))
  return int(seen.max()) or None


def _kill_descendants(pid: int) -> None:
  """SIGKILL to every process below `pid` (Ray's daemons and actors of a local cluster),
  found through /proc (Linux; elsewhere nothing is killed)."""
  children = {}
  try:
    entries = [e for e in os.listdir("/proc") if e.isdigit()]
  except OSError:
    return
  for entry in entries:
    try:
      with open(f"/proc/{entry}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue
    children.setdefault(parent, []).append(int(entry))
  below, todo = [], list(children.get(pid, ()))
  while todo:
    p = todo.pop()
    below.append(p)
    todo.extend(children.get(p, ()))
  for p in below:
    try:
      os.kill(p, signal.SIGKILL)
    except OSError:
      pass
