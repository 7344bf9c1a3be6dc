"""Starting a local Ray instance for tests."""

import time

import ray

from tests.conftest import ROOT


def start_local_ray(attempts: int = 3) -> None:
  """ray.init for the tests (2 CPUs, workers import this checkout, one CPU device each).

  A node start can time out on a loaded 2-core machine, typically right after
  another process's cluster was torn down; a failed start is cleaned up and retried.
  """
  for attempt in range(attempts):
    try:
      ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
               runtime_env={"env_vars": {"PYTHONPATH": ROOT, "XLA_FLAGS": ""}})
      return
    except Exception:  # noqa: BLE001 - Ray raises a bare Exception on startup timeouts
      ray.shutdown()
      if attempt + 1 == attempts:
        raise
      time.sleep(5)
