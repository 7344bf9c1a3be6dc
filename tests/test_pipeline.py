"""`python -m rollx.train` end to end: real Ray env workers, a real JetStream server
(Ray actor), sharded train steps, Orbax checkpoints, TensorBoard, HF export."""

import glob
import os
import signal
import struct
import subprocess
import sys

import pytest
import torch
import transformers
from tensorboardX.proto import event_pb2

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


def train(tmp_path, *extra, timeout=420):
  """(output dir, CompletedProcess) of `python -m rollx.train`. A run past `timeout`
  (below pytest's 600 s, so the child is still there) gets SIGABRT: with
  PYTHONFAULTHANDLER every thread's stack goes to its stderr, which the failure shows
  (one CI run hung here once, and pytest's own timeout saw only the parent's stack)."""
  out = tmp_path / "run"
  args = [sys.executable, "-m", "rollx.train", *train_flags(out, *extra)]
  proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=train_env(PYTHONFAULTHANDLER="1"))
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.send_signal(signal.SIGABRT)
    stdout, stderr = proc.communicate()
    pytest.fail(f"rollx.train ran past {timeout} s; its threads:\n{stderr[-8000:]}")
  return out, subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def tb_scalars(logs):
  """{scalar tag: {step: value}} from a run's TensorBoard event files."""
  scalars = {}
  for name in sorted(os.listdir(logs)):
    with open(logs / name, "rb") as f:
      data = f.read()
    i = 0
    while i + 12 <= len(data):  # TFRecords; a kill may have cut the last one short
      (n,) = struct.unpack("<Q", data[i:i + 8])
      if i + 12 + n + 4 > len(data):
        break
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      for v in event.summary.value:
        if v.WhichOneof("value") == "simple_value":
          scalars.setdefault(v.tag, {})[event.step] = v.simple_value
  return scalars


# The 3-step run of test_train_three_steps_end_to_end, made once per session by the
# `trained_run` fixture (tests/conftest.py): tests/test_eval.py evaluates its checkpoint
# and export, tests/test_tracking.py reads its console.
# Dynamic sampling asks for more informative groups (3) than a batch's 2 groups can
# give: every step plays a second batch, and trains on both; and the 16-row minibatch
# runs in 2 microbatches: the update accumulates gradients, the log-prob pass runs 8
# rows at a time.
THREE_STEPS = ("--config.max_steps=3", "--config.min_informative_groups=3",
               "--config.max_rollout_rounds=2",
               "--config.actor_train.training_args.per_device_train_batch_size=8",
               "--config.actor_train.training_args.gradient_accumulation_steps=2")


def test_train_three_steps_end_to_end(trained_run):
  out, result = trained_run
  assert result.returncode == 0, result.stderr[-3000:]
  assert "step 3/3" in result.stdout
  # checkpoints at step 2 and at the end
  steps = sorted(int(os.path.basename(p)) for p in glob.glob(f"{out}/checkpoints/*")
                 if os.path.basename(p).isdigit())
  assert steps == [2, 3]
  scalars = tb_scalars(out / "logs" / "frozenlake_grpo")
  # the config drops zero-advantage samples: a fraction of the batch trained, per step
  assert sorted(scalars["rollout/kept_samples"]) == [0, 1, 2]
  assert all(0 <= v <= 1 for v in scalars["rollout/kept_samples"].values())
  assert all(v < 0 for v in scalars["rollout/min_token_logp"].values())
  # the servers' behaviour log-probs reached the learner through the env workers and the
  # scheduler: sync, temperature 1, fp32 on both sides, the same weights -> they agree
  # with the trainer's old log-probs (the correction resolves to none)
  assert sorted(scalars["rollout_correction/mismatch_abs"]) == [0, 1, 2]
  assert all(v < 1e-4 for v in scalars["rollout_correction/mismatch_abs"].values())
  assert all(v == 0 for v in scalars["rollout_correction/version_lag_mean"].values())
  assert scalars["rollout/rounds"] == {0: 2.0, 1: 2.0, 2: 2.0}
  # the servers prefilled each turn's ~40-token history-free prompt whole (no reuse_kv)
  assert sorted(scalars["rollout/prefill_tokens_per_turn"]) == [0, 1, 2]
  assert all(30 < v < 60 for v in scalars["rollout/prefill_tokens_per_turn"].values())
  assert all(v == 0 for v in scalars["rollout/reused_tokens_per_turn"].values())
  assert scalars["FrozenLake/num_episodes"] == {0: 32.0, 1: 32.0, 2: 32.0}
  assert all(0 <= v <= 4 for v in scalars["rollout/informative_groups"].values())
  # the config bounds each actor update's KL (max_update_kl): the search ran every step
  assert sorted(scalars["actor/update_scale"]) == [0, 1, 2]
  assert all(0 <= v <= 1 for v in scalars["actor/update_scale"].values())
  # (a minibatch starting beyond the bound stays where it is: update_kl may exceed
  # proposed_kl there, so only their range is checked; tests/test_trust_region.py has
  # the semantics)
  assert all(0 <= scalars[k][s] < 1e3 for k in ("actor/update_kl", "actor/proposed_kl")
             for s in range(3))
  assert glob.glob(f"{out}/render/step_00000/*/episode.gif")
  model = transformers.AutoModelForCausalLM.from_pretrained(f"{out}/export", local_files_only=True)
  with torch.no_grad():
    logits = model(torch.tensor([[1, 2, 3]])).logits
  assert logits.shape[-1] >= len(transformers.AutoTokenizer.from_pretrained(f"{out}/export"))
