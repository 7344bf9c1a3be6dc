"""Starting a local Ray instance for tests."""

from rollx import cluster
from tests.conftest import ROOT


def start_local_ray() -> None:
  """ray.init for the tests (2 CPUs, workers import this checkout, one CPU device each),
  retried as rollx's own start is when the node start times out."""
  cluster.start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False,
                          runtime_env={"env_vars": {"PYTHONPATH": ROOT, "XLA_FLAGS": ""}})
