"""The train state (params + optimizer state + step), its optimizer, its shardings."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  opt_state: Any


def lr_schedule(training_args, total_steps: int) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then constant / linear / cosine decay to 0 at
  `total_steps` (optimizer updates)."""
  lr = float(training_args.learning_rate)
  warmup = int(training_args.warmup_steps)
  decay_steps = max(int(total_steps) - warmup, 1)
  kind = training_args.lr_scheduler_type
  if kind == "constant":
    after = optax.constant_schedule(lr)
  elif kind == "linear":
    after = optax.linear_schedule(lr, 0.0, decay_steps)
  elif kind == "cosine":
    after = optax.cosine_decay_schedule(lr, decay_steps)
  else:
    raise ValueError(f"training_args.lr_scheduler_type {kind!r} is not constant/linear/cosine")
  if warmup <= 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def _decay_mask(params):
  # Weight decay on matrices only: norms, biases and the value head's scalar are exempt.
  return jax.tree_util.tree_map_with_path(
      lambda path, p: not path[-1].key.endswith(("layernorm", "norm", "_bias")) and p.ndim >= 2,
      params)


def make_optimizer(training_args, total_steps: int) -> optax.GradientTransformation:
  """Clip by global norm (`max_grad_norm` <= 0: off), then AdamW on the schedule."""
  chain = []
  if float(training_args.max_grad_norm) > 0:
    chain.append(optax.clip_by_global_norm(float(training_args.max_grad_norm)))
  chain.append(optax.adamw(lr_schedule(training_args, total_steps),
                           b1=float(training_args.adam_beta1), b2=float(training_args.adam_beta2),
                           eps=float(training_args.adam_eps),
                           weight_decay=float(training_args.weight_decay), mask=_decay_mask))
  return optax.chain(*chain)


def new_state(params, tx: optax.GradientTransformation) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
