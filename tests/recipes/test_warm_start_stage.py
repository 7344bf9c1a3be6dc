"""The warm start as its own stage: `python -m rollx.recipes.warm_start --config=C --out=DIR`
writes a model directory that `pretrain` takes; the same recipe again reuses it."""

import os
import subprocess
import sys

from rollx.models import hf
from tests.conftest import ROOT


def _stage(*args):
  return subprocess.run([sys.executable, "-m", "rollx.recipes.warm_start",
                         "--config=configs/frozenlake.py", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def test_the_stage_writes_a_model_directory_once_and_reuses_it(tmp_path):
  out = tmp_path / "start"
  first = _stage("--config.warm_start_steps=1", f"--out={out}")
  assert first.returncode == 0, first.stderr[-3000:]
  assert f"warm start: built {out} (1 steps" in first.stdout, first.stdout
  assert f"--config.pretrain={out} --config.warm_start_steps=0" in first.stdout
  hf.load_model_config(str(out))  # an HF directory `pretrain` takes
  hf.load_tokenizer(str(out))
  stamp = os.path.getmtime(out / "model.safetensors")
  again = _stage("--config.warm_start_steps=1", f"--out={out}")
  assert again.returncode == 0 and f"warm start: reused {out}\n" in again.stdout, again.stdout
  assert os.path.getmtime(out / "model.safetensors") == stamp
  # no steps asked for, or a directory that is not a warm start: one line naming it
  none = _stage(f"--out={tmp_path / 'other'}")
  assert none.returncode == 2 and "--config.warm_start_steps" in none.stderr, none.stderr
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("keep me")
  mine = _stage("--config.warm_start_steps=1", f"--out={tmp_path / 'mine'}")
  assert mine.returncode == 2 and "is not a warm start" in mine.stderr, mine.stderr
  assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
