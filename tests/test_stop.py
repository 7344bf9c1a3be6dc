"""Clean stops of a real `python -m rollx.train` run (local Ray cluster, JetStream server
actor, Orbax), signalled mid-step once its first step finished:

  T  SIGTERM to the trainer process (what a batch scheduler sends), no planned save due:
     the stop saves checkpoint 1 itself;
  I  SIGINT to the run's whole process group (Ctrl-C in a terminal), a planned save every
     step: checkpoint 1 is the planned one, the reference for T's;
  R  T resumed with the command its last line names (one more step).

T starts from a two-step warm start (`--config.warm_start_steps=2`): rollx.train builds
it before the pipeline, and R, the same command again, reuses it.

Each exits with one line (no traceback, no stack dump), with 128 + the signal's number,
and leaves no process of its run behind. Rollouts are not bitwise reproducible across
runs (groups arrive in completion order), so T's checkpoint is compared with I's planned
one in what a planned save fixes: the step, the optimizer's step, the level streams,
every leaf's name, shape and dtype; the restore itself is bitwise (tests/test_resume.py).
"""

import os
import re
import shlex
import signal
import sys

import pytest

from tests.test_pipeline import train_flags
from tests.test_resume import Run, _read_raw

pytestmark = pytest.mark.timeout(900)

MAX_STEPS = 3
EXTRA = [f"--config.max_steps={MAX_STEPS}", "--config.eval_steps=100",
         "--config.custom_envs.FrozenLake.env_config.max_steps=3"]


def _stop_mid_step(run, signum, group):
  """The signal once the first step's console line is out, i.e. during the second step."""
  run.wait_for(lambda: re.search(rf"(?m)^step 1/{MAX_STEPS} ", run.output()), "step 1")
  if group:
    os.killpg(run.proc.pid, signum)
  else:
    os.kill(run.proc.pid, signum)
  run.finish()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  work = tmp_path_factory.mktemp("stop")
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tmp_path_factory.mktemp("jax_cache")
  train = [sys.executable, "-m", "rollx.train"]
  made = {}
  try:
    t_out = work / "t"
    t = made["T"] = Run(work, "T", [*train, *train_flags(t_out, *EXTRA, "--config.save_steps=100",
                                                     "--config.warm_start_steps=2")],
                        cache)
    _stop_mid_step(t, signal.SIGTERM, group=False)
    made["T_raw"] = _read_raw(t_out / "checkpoints" / "1")
    made["T_listing"] = sorted(os.listdir(t_out / "checkpoints"))

    i_out = work / "i"
    i = made["I"] = Run(work, "I", [*train, *train_flags(i_out, *EXTRA, "--config.save_steps=1")],
                        cache)
    _stop_mid_step(i, signal.SIGINT, group=True)
    made["I_raw"] = _read_raw(i_out / "checkpoints" / "1")

    last = t.output().strip().splitlines()[-1]
    command = shlex.split(last.split("; resume: ", 1)[1])
    assert command[1:3] == ["-m", "rollx.train"], last
    r = made["R"] = Run(work, "R", [sys.executable, *command[1:], "--config.max_steps=2"], cache)
    r.finish()
    made["R_listing"] = sorted(os.listdir(t_out / "checkpoints"))
    made["t_out"] = t_out
  finally:
    for run in made.values():
      if isinstance(run, Run):
        run.kill()
  return made


def _last_line(run):
  return run.output().strip().splitlines()[-1]


@pytest.mark.parametrize("name,signum", [("T", signal.SIGTERM), ("I", signal.SIGINT)])
def test_a_signal_mid_step_ends_the_run_with_one_line_and_no_process_left(runs, name, signum):
  run = runs[name]
  assert run.proc.returncode == 128 + signum, run.output()[-3000:]
  assert run.leaked == []
  text = run.output()
  assert "Traceback" not in text and "SIGTERM received" not in text, text[-3000:]
  signame = signal.Signals(signum).name
  out = runs["t_out"] if name == "T" else runs["t_out"].parent / "i"
  assert _last_line(run).startswith(
      f"rollx.train: stopped by {signame} after 1/{MAX_STEPS} steps: saved "
      f"{out / 'checkpoints' / '1'}; resume: python -m rollx.train --config=configs/frozenlake.py ")
  assert _last_line(run).endswith(" --config.resume_from_checkpoint=true")


def test_the_stop_checkpoint_is_the_last_finished_step_as_a_planned_save_writes_it(runs):
  assert runs["T_listing"] == ["1"]  # saved by the stop: no planned save was due
  stopped, planned = runs["T_raw"], runs["I_raw"]
  s_actor, _, s_meta = stopped
  p_actor, _, p_meta = planned
  assert s_meta["step"] == p_meta["step"] == 1
  # the updates of one finished step, no more
  assert int(s_actor["step"]) == int(p_actor["step"]) > 0
  assert sorted(s_meta) == sorted(p_meta)
  # the streams as they stood after step 0, not moved on by the dropped step's rollout
  assert s_meta["train_streams"] == p_meta["train_streams"] != {}
  assert s_meta["val_streams"] == p_meta["val_streams"]
  assert sorted(s_actor) == sorted(p_actor)
  for k, v in s_actor.items():
    assert (v.shape, v.dtype) == (p_actor[k].shape, p_actor[k].dtype), k


def test_the_printed_command_resumes_from_the_stop_checkpoint(runs):
  r = runs["R"]
  assert r.proc.returncode == 0, r.output()[-3000:]
  assert r.leaked == []
  assert re.findall(r"(?m)^step (\d+)/2 ", r.output()) == ["2"]  # step 1 (0-based), once
  assert runs["R_listing"] == ["1", "2"]


def test_the_warm_start_is_built_by_the_first_call_and_reused_by_the_second(runs):
  start = runs["t_out"] / "warm_start"
  assert re.search(rf"(?m)^warm start: built {re.escape(str(start))} \(2 steps, \d+ s\)$",
                   runs["T"].output()), runs["T"].output()[-3000:]
  assert f"warm start: reused {start}\n" in runs["R"].output(), runs["R"].output()[-3000:]
