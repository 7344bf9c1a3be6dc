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
from tests.test_sharding import CFG, initial_params, make_batch, policy_loss, worker

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
  tx = make_optimizer(args("init"), total_steps=10)
  state = tx.init(params0)
  moved = jax.tree.map(lambda p: p + 1.0, params0)  # every weight 1.0 from its start
  zero_grads = jax.tree.map(jnp.zeros_like, params0)  # Adam's part of the update is 0
  updates, _ = tx.update(zero_grads, state, moved)
  # decoupled decay: -lr * wd * (p - p0) on matrices; norms are exempt
  np.testing.assert_allclose(updates["layers"]["q_proj"], -LR * WD * np.ones((4, 3)), rtol=1e-6)
  np.testing.assert_array_equal(updates["layers"]["input_layernorm"], np.zeros(4))
  # at the start there is nothing to decay: the update is plain Adam's
  g = jax.tree.map(lambda p: jnp.sin(3 * p), params0)
  t = args("init")
  plain = optax.adam(LR, b1=t.adam_beta1, b2=t.adam_beta2, eps=t.adam_eps)
  want, _ = plain.update(g, plain.init(params0), params0)
  got, _ = tx.update(g, state, params0)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  # and `zero` is AdamW: the same moved params decay towards 0, i.e. by lr * wd * p
  tx0 = make_optimizer(args("zero"), total_steps=10)
  updates0, _ = tx0.update(zero_grads, tx0.init(params0), moved)
  np.testing.assert_allclose(updates0["layers"]["q_proj"],
                             -LR * WD * np.asarray(moved["layers"]["q_proj"]), rtol=1e-6)


def test_bad_target_names_the_key():
  with pytest.raises(ValueError, match="weight_decay_target 'l2'"):
    make_optimizer(args("l2"), total_steps=10)


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
