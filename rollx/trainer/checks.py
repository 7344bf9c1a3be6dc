"""Config checks of a worker role's model and optimizer: what the role is (its model
type and strategy), `model_args` (dtype, attention) and `training_args` (learning rate,
schedule, weight decay, batch sizes). Called by rollx.checks for every role.
"""

from __future__ import annotations

from rollx import config as config_lib
from rollx.config_check import Checker, is_int
from rollx.errors import ConfigError
from rollx.models import lora


def check_model_and_training(c: Checker, role: str, w) -> None:
  c.choice(w.model_args, "dtype", f"{role}.model_args.dtype", config_lib.DTYPES)
  c.choice(w.model_args, "model_type", f"{role}.model_args.model_type",
           (config_lib.ROLE_MODEL_TYPES[role],))
  c.choice(w.strategy_args, "strategy_name", f"{role}.strategy_args.strategy_name",
           (config_lib.ROLE_STRATEGIES[role],))
  c.choice(w.model_args, "attn_implementation", f"{role}.model_args.attn_implementation",
           config_lib.ATTN_IMPLEMENTATIONS)
  if is_int(w.model_args.attention_block):
    c.rule(w.model_args.attention_block >= 0, f"{role}.model_args.attention_block",
           f"must be >= 0 (0: one dense softmax), got {w.model_args.attention_block}")
  if role == "actor_train":
    try:
      lora.from_config(w.model_args.lora, f"{role}.model_args.lora")
    except ConfigError as e:
      c.errors.extend(e.errors)
  t = w.training_args
  c.choice(t, "lr_scheduler_type", f"{role}.training_args.lr_scheduler_type",
           config_lib.LR_SCHEDULERS)
  c.choice(t, "weight_decay_target", f"{role}.training_args.weight_decay_target",
           config_lib.WEIGHT_DECAY_TARGETS)
  for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
    if is_int(t[key]):
      c.rule(t[key] >= 1, f"{role}.training_args.{key}", f"must be >= 1, got {t[key]}")
  for key in ("learning_rate", "weight_decay"):
    if isinstance(t[key], float):
      c.rule(t[key] >= 0, f"{role}.training_args.{key}", f"must be >= 0, got {t[key]}")
  if is_int(t.warmup_steps):
    c.rule(t.warmup_steps >= 0, f"{role}.training_args.warmup_steps",
           f"must be >= 0, got {t.warmup_steps}")
