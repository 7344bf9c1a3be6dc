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

`apply()` is idempotent and must run before jetstream is imported by anything
that executes a request. tests/test_serving.py fails if either patch stops being
needed (JAX regains `tree_map`, JetThread stops killing) or stops working.
"""

from __future__ import annotations

import logging
import threading
import traceback

import jax

_APPLIED = False
DEAD_THREADS: list = []  # (thread name, exception text), appended by the patched run
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
    from jetstream.core import orchestrator
    root.setLevel(level)
    for h in root.handlers[:]:
      if h not in handlers:
        root.removeHandler(h)

    def run(self):
      try:
        threading.Thread.run(self)
      except Exception as e:  # noqa: BLE001 - this is the crash handler
        logging.error("JetStream thread %s died: %s\n%s", self.name, e, traceback.format_exc())
        DEAD_THREADS.append((self.name, f"{type(e).__name__}: {e}"))

    orchestrator.JetThread.run = run
    _APPLIED = True
