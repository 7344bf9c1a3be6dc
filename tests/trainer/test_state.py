"""The optimizer: AdamW's decay towards zero or towards the initial params (L2 init)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rollx import checkpoint
from rollx.parallel import mesh as mesh_lib
from rollx.trainer.state import DecayTowardInitState, make_optimizer
from rollx.trainer.step import Trainer
from tests.parallel.test_sharding import CFG, initial_params, make_batch, policy_loss, worker

LR, WD = 0.1, 0.5


def args(target):
  w = worker()
  w.training_args.update(learning_rate=LR, weight_decay=WD, weight_decay_target=target,
                         max_grad_norm=0.0, warmup_steps=0)
  return w.training_args


def tree():
  rng = np.random.default_rng(0)
  return {"layers": {"q_proj": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                     "input_layernorm": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}}


def test_decay_pulls_towards_the_initial_params_not_zero():
  params0 = tree()
  tx = make_optimizer(args("init"))
  state = tx.init(params0)
  moved = jax.tree.map(lambda p: p + 1.0, params0)  # every weight 1.0 from its start
  zero_grads = jax.tree.map(jnp.zeros_like, params0)  # Adam's part of the update is 0
  updates, _ = tx.update(zero_grads, state, moved)
  # decoupled decay: -lr * wd * (p - p0) on matrices; norms are exempt (the optimizer's
  # updates are at lr 1: the train step scales them by the schedule's rate)
  np.testing.assert_allclose(updates["layers"]["q_proj"], -WD * np.ones((4, 3)), rtol=1e-6)
  np.testing.assert_array_equal(updates["layers"]["input_layernorm"], np.zeros(4))
  # at the start there is nothing to decay: the update is plain Adam's
  g = jax.tree.map(lambda p: jnp.sin(3 * p), params0)
  t = args("init")
  plain = optax.adam(1.0, b1=t.adam_beta1, b2=t.adam_beta2, eps=t.adam_eps)
  want, _ = plain.update(g, plain.init(params0), params0)
  got, _ = tx.update(g, state, params0)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  # and `zero` is AdamW: the same moved params decay towards 0, i.e. by lr * wd * p
  tx0 = make_optimizer(args("zero"))
  updates0, _ = tx0.update(zero_grads, tx0.init(params0), moved)
  np.testing.assert_allclose(updates0["layers"]["q_proj"],
                             -WD * np.asarray(moved["layers"]["q_proj"]), rtol=1e-6)


def test_bad_target_names_the_key():
  with pytest.raises(ValueError, match="weight_decay_target 'l2'"):
    make_optimizer(args("l2"))


def test_the_centre_is_sharded_like_the_params_and_restored_bitwise(tmp_path):
  w = worker(fsdp=2, tp=2)
  w.training_args.update(weight_decay=0.1, weight_decay_target="init")
  mesh = mesh_lib.make_mesh(w.strategy_args, devices=jax.devices()[:4])
  trainer = Trainer(CFG, w, mesh, policy_loss, total_steps=10)
  state = trainer.init_state(initial_params("lm"))
  batch = trainer.batch_sharding({k: jnp.asarray(v) for k, v in make_batch().items()})
  state, _ = trainer.update(state, batch, jax.random.PRNGKey(0))
  centre = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: isinstance(
      x, DecayTowardInitState)) if isinstance(s, DecayTowardInitState)]
  assert len(centre) == 1
  for (path, p0), p, s in zip(jax.tree_util.tree_flatten_with_path(centre[0].init_params)[0],
                              jax.tree.leaves(initial_params("lm")),
                              jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(p0), np.asarray(p))  # the start, not the step
    assert p0.sharding == s.sharding, path
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(1, {"actor": state}, {"step": 1})
  restored, _ = checkpoint.Checkpointer(str(tmp_path / "checkpoints")).restore(
      1, {"actor": checkpoint.abstract_of(state, trainer.state_shardings)})
  for a, b in zip(jax.tree.leaves(restored["actor"]), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a.sharding == b.sharding


def test_the_schedule_spans_the_run_however_many_updates_a_step_makes():
  # a cosine schedule over 4 global steps; the steps make 1, 3 (dynamic-sampling
  # rounds), 2 and 1 minibatch updates: every update of a step has that step's rate,
  # and the last step still trains (a horizon counted in updates ended at step 1)
  import types
  from rollx import checks, config as config_lib, models
  from rollx.trainer.learner import Learner
  from rollx.trainer.state import lr_schedule
  c = config_lib.default_config()
  c.custom_envs.FrozenLake = config_lib.env_entry("FrozenLake")
  c.update(max_steps=4, rollout_batch_size=8, sequence_length=16, drop_zero_advantage_samples=True)
  c.train_env_manager.update(group_size=4, num_env_groups=2)
  c.actor_train.device_mapping = (0,)
  c.actor_train.training_args.update(per_device_train_batch_size=4, learning_rate=1e-3,
                                     lr_scheduler_type="cosine")
  c = checks.validate(c)
  learner = Learner(c, models.load_model(None))
  schedule = lr_schedule(c.actor_train.training_args, c.max_steps)
  rng = np.random.default_rng(0)
  rates = []
  for step, minibatches in enumerate((1, 3, 2, 1)):
    n = 4 * minibatches
    samples = {"input_ids": rng.integers(3, 500, (n, 16)).astype(np.int32),
               "segment_ids": np.ones((n, 16), np.int32),
               "response_mask": np.tile((np.arange(16) >= 12).astype(np.float32), (n, 1))}
    adv = samples["response_mask"] * rng.choice([-1.0, 1.0], (n, 1)).astype(np.float32)
    metrics = {}
    learner.learn(types.SimpleNamespace(trajectories=[None] * n), samples, adv, adv.copy(),
                  step, metrics)
    rates.append(metrics["actor/lr"])
    np.testing.assert_allclose(metrics["actor/lr"], float(schedule(step)), rtol=1e-6)
  assert int(learner.actor_state.step) == 7
  assert rates[-1] > 0.1 * 1e-3 and rates == sorted(rates, reverse=True)
