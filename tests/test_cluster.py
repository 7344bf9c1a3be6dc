"""rollx.cluster's local Ray start: a node start that times out is retried, any other
failure is not; its workers run at the caller's priority."""

import pytest
import ray

from rollx import cluster


def test_a_local_node_start_that_times_out_is_retried(monkeypatch):
  calls, shutdowns = [], []

  def init_failing(*errors):
    def init(**kwargs):
      calls.append(kwargs)
      if len(calls) <= len(errors):
        raise errors[len(calls) - 1]
    return init

  timeout = Exception("The current node timed out during startup. This could happen ...")
  monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
  monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
  monkeypatch.setattr(ray, "init", init_failing(timeout))
  cluster.start_local_ray(num_cpus=2)
  niced = {"num_cpus": 2, "_system_config": {"worker_niceness": 0}}
  assert calls == [niced] * 2 and shutdowns == [1]

  calls.clear()  # the other way Ray says it: a port file not written in time
  monkeypatch.setattr(ray, "init", init_failing(RuntimeError(
      "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_0e72")))
  cluster.start_local_ray(num_cpus=2)
  assert len(calls) == 2

  calls.clear()
  monkeypatch.setattr(ray, "init", init_failing(ValueError("bad runtime_env")))
  with pytest.raises(ValueError, match="bad runtime_env"):
    cluster.start_local_ray(num_cpus=2)
  assert len(calls) == 1  # not a startup timeout: raised at once

  calls.clear()
  monkeypatch.setattr(ray, "init", init_failing(timeout, timeout, Exception(
      "The current node timed out during startup (third)")))
  with pytest.raises(Exception, match=r"\(third\)"):
    cluster.start_local_ray(num_cpus=2)
  assert len(calls) == 3

  calls.clear()
  monkeypatch.setattr(ray, "init", init_failing())
  cluster.start_local_ray(_system_config={"object_timeout_milliseconds": 5, "worker_niceness": 3})
  assert calls == [{"_system_config": {"object_timeout_milliseconds": 5, "worker_niceness": 3}}]
