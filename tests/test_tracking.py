"""The console and the statistics it shows: tqdm's progress, one line per step and per
validation, no library INFO records (tests/test_pipeline.py's run, shared), Wilson
intervals and pass@k."""

import math
import re
import subprocess
import sys

import pytest

from rollx import tracking
from tests.conftest import ROOT
from tests.test_pipeline import train_env

# What must not reach the console of a run: absl / TensorFlow native records (I or W,
# then the date), Python logging's INFO records (absl's handler: "I1127 ..."; Ray's:
# "... INFO worker.py:..."), TensorFlow's start-up notices, Ray's notices.
LIBRARY_RECORDS = re.compile(
    r"^[IW]\d{4} |\bINFO\b|All log messages before absl::InitializeLog|oneDNN|cuda drivers|"
    r"cuInit|Started a local Ray instance|constructor arguments|Token authentication",
    re.M)
STEP_LINE = re.compile(r"^step (\d+)/3 \[\d\d:\d\d(<\d\d:\d\d, +[\d.]+(s/step|step/s)|, first "
                       r"step: startup and compilation)\] score=[-\d.]+ success=[\d.]+ ", re.M)
VAL_LINE = re.compile(r"^val @ (\d+)/3 FrozenLake success=[\d.]+ \(95% CI [\d.]+-[\d.]+, "
                      r"n=4\) score=[-\d.]+ invalid=[\d.]+$", re.M)


def test_train_console_has_step_and_validation_lines_and_no_library_records(trained_run):
  _, result = trained_run
  assert result.returncode == 0, result.stderr[-3000:]
  console = result.stdout + result.stderr
  assert not LIBRARY_RECORDS.search(console), LIBRARY_RECORDS.search(console).group(0) + \
      "\n" + console[-3000:]
  assert [int(m.group(1)) for m in STEP_LINE.finditer(result.stdout)] == [1, 2, 3]
  assert [int(m.group(1)) for m in VAL_LINE.finditer(result.stdout)] == [0, 2]  # eval_steps=2
  # and nothing else: stdout is the run's first line (the correction in force) and those
  # 5 lines (no bar: stderr is not a terminal)
  lines = [l for l in result.stdout.splitlines() if l.strip()]
  assert lines[0].startswith("rollout correction: none (auto: on-policy"), result.stdout
  assert len(lines) == 6, result.stdout
  assert not result.stderr.strip(), result.stderr[-3000:]


def test_importing_the_server_loads_no_tensorflow():
  # JetStream 0.2.2 imports seqio (and so TensorFlow) for text tokenization rollx never
  # does; rollx.serving.compat stands in for it: no TensorFlow, nothing on the console
  code = ("import sys; from rollx.serving import compat; compat.apply(); "
          "from jetstream.engine import engine_api; from rollx.serving import server; "
          "print('tensorflow' in sys.modules, hasattr(sys.modules['seqio'], '__file__'))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=train_env())
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ["False", "False"] and not result.stderr.strip(), (
      result.stdout, result.stderr[-3000:])


def test_console_lines(capsys, monkeypatch):
  clock = [1000.0]
  monkeypatch.setattr(tracking.time, "time", lambda: clock[0])
  t = tracking.Tracker("/unused", max_steps=200, enabled=False)
  clock[0] += 45.0  # the run's first step: startup and compiles
  t.console(4, {"score": 0.5, "success": 0.25, "val/FrozenLake/success": 0.75,
                "val/FrozenLake/num_episodes": 128, "val/FrozenLake/score_mean": 0.6,
                "val/FrozenLake/invalid_action_rate": 0.0, "tokens_per_s": 1000.0})
  val, step = capsys.readouterr().out.splitlines()
  low, high = tracking.wilson_interval(96, 128)
  assert val == (f"val @ 4/200 FrozenLake success=0.750 (95% CI {low:.3f}-{high:.3f}, n=128) "
                 "score=0.600 invalid=0.000")
  # resumed at step 4: its first step is named for what it mostly is
  assert step.startswith("step 5/200 [00:45, first step: startup and compilation] "
                         "score=0.500 success=0.250 ")
  assert step.endswith("tokens_per_s=1000.000")
  clock[0] += 20.0  # two steps of 10 s: the rate and the time left count them, not the compile
  t.console(5, {})
  t.console(6, {})
  assert capsys.readouterr().out.splitlines()[-1] == "step 7/200 [01:05<32:10, 10.00s/step] "
  t.close()
  # a wall-clock budget (rollx.curve --minutes=35): time against it, not 7/100000
  t = tracking.Tracker("/unused", max_steps=100_000, enabled=False)
  t.set_budget(35 * 60, start=clock[0] - 60.0)
  t.console(0, {})
  clock[0] += 600.0
  t.console(10, {})
  first, later = capsys.readouterr().out.splitlines()
  assert first == "step 1 [01:00 of 35:00, 34:00 left, first step: startup and compilation] "
  assert later == "step 11 [11:00 of 35:00, 24:00 left, 60.00s/step] "
  t.close()


def test_wilson_interval():
  low, high = tracking.wilson_interval(15, 128)  # 0.117: 95% interval 0.072 - 0.184
  assert (round(low, 3), round(high, 3)) == (0.072, 0.184)
  assert tracking.wilson_interval(0, 10)[0] == 0.0 and tracking.wilson_interval(10, 10)[1] == 1.0
  assert tracking.wilson_interval(0, 10)[1] > 0.2  # not degenerate at 0 successes
  assert tracking.wilson_interval(0, 0) == (0.0, 1.0)


def test_pass_at_k_is_the_unbiased_estimator():
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert tracking.pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
  assert tracking.pass_at_k(10, 3, 1) == pytest.approx(0.3)
  with pytest.raises(ValueError):
    tracking.pass_at_k(2, 1, 3)
