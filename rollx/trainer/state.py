"""The train state (params + optimizer state + step, and frozen weights), its optimizer."""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array  # optimizer updates made
  params: Any
  opt_state: Any
  # Where the learning-rate schedule stands: +1 per update unless the owner sets it
  # (the learner sets it to the global step, so the schedule spans the run's steps
  # however many updates each step makes).
  schedule_step: jax.Array
  # Weights the step reads but never updates (no gradient, no optimizer state): the base
  # model under LoRA adapters (rollx.models.lora), whose adapters are `params`; else None.
  frozen: Any = None


def lr_schedule(training_args, total_steps: int) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then constant / linear / cosine decay to 0 at
  `total_steps` (in the unit of TrainState.schedule_step)."""
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


class DecayTowardInitState(NamedTuple):
  init_params: Any  # the params the optimizer was initialised with (checkpointed)


def decay_toward_init(weight_decay: float, mask) -> optax.GradientTransformation:
  """updates += weight_decay * (params - init_params) on the masked leaves.

  AdamW's decoupled decay, with the params at the start of training as its centre
  instead of zero ("L2 init", Kumar et al. 2023). An RL run from a warm start moved
  every matrix by ~50-90% of its norm in 30 minutes, and afterwards the network no
  longer learned from labels what the warm start still could (measured on
  configs/frozenlake.py, docs/frozenlake_recipe.md); this pulls each weight back
  towards the warm start at rate lr * weight_decay per update, in weight space, beside the KL terms that anchor the
  policy's outputs. The centre is optimizer state (one more copy of the params,
  sharded like them): saved and restored with it, so a resumed run keeps the run's
  start as its centre, not the resume point.
  """
  def init_fn(params):
    return DecayTowardInitState(init_params=jax.tree_util.tree_map(jnp.copy, params))

  def update_fn(updates, state, params):
    if params is None:
      raise ValueError("decay_toward_init needs the params: call tx.update(g, s, params)")
    on = mask(params) if callable(mask) else mask
    updates = jax.tree_util.tree_map(
        lambda u, p, p0, decayed: u + weight_decay * (p - p0) if decayed else u,
        updates, params, state.init_params, on)
    return updates, state

  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(training_args) -> optax.GradientTransformation:
  """Clip by global norm (`max_grad_norm` <= 0: off), then AdamW at learning rate 1; the
  step scales the updates by the schedule's rate (AdamW's update is linear in it). With
  `weight_decay_target="init"` the decay pulls towards the initial params, not zero."""
  chain = []
  if float(training_args.max_grad_norm) > 0:
    chain.append(optax.clip_by_global_norm(float(training_args.max_grad_norm)))
  adam = dict(b1=float(training_args.adam_beta1), b2=float(training_args.adam_beta2),
              eps=float(training_args.adam_eps))
  weight_decay = float(training_args.weight_decay)
  target = training_args.get("weight_decay_target", "zero")
  if target == "zero":
    chain.append(optax.adamw(1.0, **adam, weight_decay=weight_decay, mask=_decay_mask))
  elif target == "init":
    # optax.adamw's order (Adam scaling, decay, learning rate) with our decay centre
    chain += [optax.scale_by_adam(**adam), decay_toward_init(weight_decay, _decay_mask),
              optax.scale_by_learning_rate(1.0)]
  else:
    raise ValueError(f"training_args.weight_decay_target {target!r} is not zero/init")
  return optax.chain(*chain)


def new_state(params, tx: optax.GradientTransformation, frozen=None) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    schedule_step=jnp.zeros((), jnp.int32), frozen=frozen)
