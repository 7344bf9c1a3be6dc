"""`python -m rollx.train` as a user runs it: bad input exits non-zero with one line.

The full run is tests/test_pipeline.py."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def run(*args):
  return subprocess.run([sys.executable, "-m", "rollx.train", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("override,needle", [
    ("--config.max_steps=abc", "--config.max_steps=abc"),
    ("--config.max_stepz=3", "--config.max_stepz"),
    ("--config.train_env_manager.tags=('Nope',)", "config.train_env_manager.tags"),
    ("--config.train_env_manager.num_groups_partition=(3,)",
     "config.train_env_manager.num_groups_partition"),
    ("--config.custom_envs.FrozenLake.env_config.size=1",
     "config.custom_envs.FrozenLake.env_config"),
    ("--config.pretrain=/no/such/dir", "config.pretrain"),
])
def test_bad_override_is_one_line_naming_the_key(override, needle):
  result = run("--config=configs/frozenlake.py", override)
  assert result.returncode != 0
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, result.stderr
  assert needle in lines[0] and "Traceback" not in result.stderr


def test_missing_config_file():
  result = run("--config=configs/nope.py")
  assert result.returncode != 0
  assert "configs/nope.py" in result.stderr and "Traceback" not in result.stderr


def test_bad_config_argument_is_one_line_naming_it():
  result = run("--config=configs/sokoban.py:bogus")
  assert result.returncode == 2
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
  assert "configs/sokoban.py:bogus" in lines[0] and "'bogus'" in lines[0]
