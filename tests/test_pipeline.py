"""`python -m rollx.train` end to end: real Ray env workers, a real JetStream server
(Ray actor), sharded train steps, Orbax checkpoints, TensorBoard, HF export."""

import glob
import os
import subprocess
import sys

import torch
import transformers

from tests.conftest import ROOT

SMALL = [
    "--config.rollout_batch_size=16",
    "--config.train_env_manager.num_env_groups=2",
    "--config.train_env_manager.group_size=8",
    "--config.val_env_manager.num_env_groups=4",
    "--config.val_batch_size=4",
    "--config.eval_steps=2",
    "--config.save_steps=2",
    "--config.actor_train.training_args.per_device_train_batch_size=16",
    "--config.actor_infer.strategy_args.max_concurrent_decodes=16",
]


def train_flags(out, *extra):
  """Flags of a tiny run of the default config writing everything under `out`; later
  flags override earlier ones."""
  return ["--config=configs/frozenlake.py", f"--config.output_dir={out}",
          f"--config.logging_dir={out}/logs", f"--config.render_save_dir={out}/render",
          *SMALL, *extra]


def train_env(**extra):
  """The environment of a training subprocess: one CPU device, this checkout."""
  return dict(os.environ, XLA_FLAGS="", PYTHONPATH=ROOT, **extra)


def train(tmp_path, *extra, timeout=900):
  out = tmp_path / "run"
  args = [sys.executable, "-m", "rollx.train", *train_flags(out, *extra)]
  return out, subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env=train_env())


def test_train_three_steps_end_to_end(tmp_path):
  out, result = train(tmp_path, "--config.max_steps=3")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "step 3/3" in result.stdout
  # checkpoints at step 2 and at the end
  steps = sorted(int(os.path.basename(p)) for p in glob.glob(f"{out}/checkpoints/*")
                 if os.path.basename(p).isdigit())
  assert steps == [2, 3]
  assert glob.glob(f"{out}/logs/frozenlake_grpo/events.out.tfevents.*")
  assert glob.glob(f"{out}/render/step_00000/*/episode.gif")
  model = transformers.AutoModelForCausalLM.from_pretrained(f"{out}/export", local_files_only=True)
  with torch.no_grad():
    logits = model(torch.tensor([[1, 2, 3]])).logits
  assert logits.shape[-1] >= len(transformers.AutoTokenizer.from_pretrained(f"{out}/export"))
