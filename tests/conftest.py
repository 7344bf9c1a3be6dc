import atexit
import os
import shutil
import sys
import tempfile

import pytest

# Sharding is tested on 8 simulated CPU devices; this must precede any jax import.
# The tests' programs are tiny and each runs a few times, so compiling them is most of
# their cost: XLA's backend optimisation level 0 compiles them faster (one test of
# tests/trainer/test_packing.py: 48 s -> 29 s on 2 cores; the in-process files together
# ~35% less). Every parity test holds at its float32 tolerance either way. The processes
# the tests start (`rollx.train`, servers, Ray workers) keep XLA's default: their decode
# loops run long enough that level 0 made them slower (the tool config's two steps:
# 118 s -> 175 s).
TEST_XLA_FLAGS = ("--xla_force_host_platform_device_count=8",
                  "--xla_backend_optimization_level=0")
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *TEST_XLA_FLAGS]).strip()

# One XLA compilation cache for the whole session, this process and the ones it starts
# (servers, env workers, `rollx.train` runs): the many engines and trainers the tests build
# compile the same programs again and again (jit caches live with each function object).
# Fresh per session, so no run depends on what an earlier one left.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix="rollx-test-xla-cache-")
  atexit.register(shutil.rmtree, _CACHE, True)
  os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE,
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# Offline by construction: nothing may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
  """(output dir, CompletedProcess) of tests/test_pipeline.py's tiny 3-step
  `python -m rollx.train` (checkpoints 2 and 3, the export), run once per session and
  shared by the tests that check the run (test_pipeline), evaluate what it saved
  (test_eval) and read its console (test_tracking)."""
  from tests.test_pipeline import THREE_STEPS, train
  return train(tmp_path_factory.mktemp("trained"), *THREE_STEPS)


# `make test` runs two pytest-xdist workers (-n 2 --dist loadfile): one test's
# single-threaded phases (XLA compilation, Python, a subprocess starting) overlap the
# other's. A worker takes a whole file at a time, so a module's fixtures (a served model,
# a chain of runs) are built once; the files that share `trained_run` go to one worker
# together, so that run is made once.
_TRAINED_RUN_FILES = ("test_pipeline.py", "test_eval.py", "test_tracking.py")


def pytest_xdist_make_scheduler(config, log):
  if config.getvalue("dist") != "loadfile":
    return None  # xdist's own
  from xdist.scheduler import LoadScopeScheduling

  class ByFile(LoadScopeScheduling):
    # (xdist's loadgroup would do this with marks, but with pytest 9.2 it ignores them)
    def _split_scope(self, nodeid):
      path = nodeid.split("::")[0]
      return "trained_run" if os.path.basename(path) in _TRAINED_RUN_FILES else path

    def _assign_work_unit(self, node):
      # longest first (once, before the first unit goes out), so that no long file starts
      # last and runs alone at the end: xdist orders by test count, which put the
      # few-test files of training runs last
      if not getattr(self, "_longest_first", False):
        rank = {scope: i for i, scope in enumerate(_LONGEST_FIRST)}
        units = sorted(self.workqueue.items(),
                       key=lambda unit: rank.get(os.path.basename(unit[0]), len(rank)))
        self.workqueue.clear()
        self.workqueue.update(units)
        self._longest_first = True
      super()._assign_work_unit(node)

  return ByFile(config, log)


# The files that take longest (worker seconds, a clean clone on 2 cores, 2026-12-07):
# their `rollx.train` runs, Ray clusters and served models.
_LONGEST_FIRST = ("test_rollout.py", "trained_run", "test_tool_loop.py", "test_serving.py",
                  "test_sharding.py", "test_stop.py", "test_openai_endpoint.py",
                  "test_resume.py", "test_kv_reuse.py", "test_server_restart.py",
                  "test_agent_program_run.py", "test_models.py", "test_launch.py",
                  "test_packing.py", "test_documented_commands.py", "test_step.py")


# A slow run (`make test-slow`: learning curves of 30-60 minutes, a 32-minute model
# rebuild) is not held to the suite's per-test timeout (setup.cfg, for hangs in
# `make test`): it gets SLOW_TIMEOUT_S unless it sets its own.
SLOW_TIMEOUT_S = 3 * 3600


def pytest_collection_modifyitems(config, items):
  for item in items:
    if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
      item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
