"""The actor's per-update trust region (`max_update_kl`, rollx.trainer.step).

Against an unconstrained Trainer on the same state and batch: an update within the
bound is applied unchanged, one past it is scaled (its move is exactly `update_scale`
times the unconstrained move) and lands near the bound, and a minibatch that starts
beyond the bound does not move the params. float32, one device; and the same step on
8 simulated devices (sharded meshes of tests/parallel/test_sharding.py) scales and lands as on one.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rollx import config as config_lib
from rollx.algos import losses
from rollx.models import logprobs
from rollx.parallel import mesh as mesh_lib
from rollx.trainer.step import Trainer
from tests.parallel.test_sharding import CFG, MESHES, initial_params, make_batch, rel_err, worker

jax.config.update("jax_default_matmul_precision", "highest")


def pg_loss(model, params, batch, rng):
  logp, _ = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"])
  m = batch["response_mask"]
  return -logprobs.masked_mean(logp * batch["advantages"], m), {
      "approx_kl": losses.approx_kl(logp, batch["old_logp"], m)}


# the KL the learner gives the actor's trust region
update_kl = functools.partial(losses.update_kl, config_lib.default_config())


def trainer(max_kl=None, grad_accum=1):
  w = config_lib.default_config().actor_train
  # lr 3e-2 moves this tiny policy well past a KL of 1e-3 in one Adam step
  w.training_args.update(learning_rate=3e-2, gradient_accumulation_steps=grad_accum)
  mesh = mesh_lib.make_mesh(w.strategy_args, devices=jax.devices()[:1])
  return Trainer(CFG, w, mesh, pg_loss, total_steps=10,
                 trust_region=None if max_kl is None else (update_kl, max_kl))


def one_update(t, logp_shift=0.0):
  """(params before, params after, metrics, batch) of one update from the shared init."""
  state = t.init_state(initial_params("lm"))
  before = jax.device_get(state.params)
  batch = {k: jnp.asarray(v) for k, v in make_batch().items()}
  logp0, _ = t.compute_logprobs(state.params, batch)
  batch["old_logp"] = logp0 + logp_shift
  state, metrics = t.update(state, batch, jax.random.PRNGKey(1))
  return before, jax.device_get(state.params), jax.device_get(metrics), batch


def delta(after, before):
  return jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                      after, before)


def measured_kl(t, params, batch):
  return float(jax.jit(lambda p, b: update_kl(t.model, p, b))(params, batch))


def test_update_past_the_bound_is_scaled_to_it():
  plain = trainer()
  before, after_plain, _, batch = one_update(plain)
  proposed = measured_kl(plain, after_plain, batch)
  assert proposed > 1e-3  # the setup really overshoots

  max_kl = proposed / 4
  tr = trainer(max_kl)
  _, after_tr, m, _ = one_update(tr)
  np.testing.assert_allclose(m["proposed_kl"], proposed, rtol=1e-5)
  scale = float(m["update_scale"])
  assert 0.0 < scale < 0.25  # KL(s) is concave here: a quarter of the KL needs s < 1/4
  jax.tree.map(lambda d_tr, d_plain: np.testing.assert_allclose(d_tr, scale * d_plain,
                                                                rtol=1e-4, atol=1e-9),
               delta(after_tr, before), delta(after_plain, before))
  landed = measured_kl(tr, after_tr, batch)
  np.testing.assert_allclose(m["update_kl"], landed, rtol=1e-4)
  # measured KL(s) of this update: s 0.1 -> 0.024, 0.25 -> 0.040, 0.5 -> 0.055, 1 -> 0.094,
  # so a single quadratic guess (s = 1/2) would land at 2.3 max_kl; the search lands near it
  assert landed <= 1.25 * max_kl


def test_update_within_the_bound_is_unchanged():
  _, after_plain, _, batch = one_update(trainer())
  proposed = measured_kl(trainer(), after_plain, batch)
  _, after_tr, m, _ = one_update(trainer(max_kl=2 * proposed))
  assert float(m["update_scale"]) == 1.0
  jax.tree.map(np.testing.assert_array_equal, after_tr, after_plain)


def test_minibatch_starting_beyond_the_bound_does_not_move():
  # old_logp 0.5 nats away from the current policy on every token: kl_before = 0.125
  before, after, m, _ = one_update(trainer(max_kl=0.1), logp_shift=0.5)
  np.testing.assert_allclose(m["approx_kl"], 0.125, rtol=1e-5)
  assert float(m["update_scale"]) == 0.0
  jax.tree.map(np.testing.assert_array_equal, after, before)


def test_gradient_accumulation_measures_kl_per_microbatch():
  # with 2 microbatches the step's KL is the mean of the two microbatches' token means
  # (rows r % 2, as the loss's approx_kl), measured on the unconstrained move
  _, after_plain, _, batch = one_update(trainer(grad_accum=2))
  by_hand = np.mean([measured_kl(trainer(), after_plain, {k: v[i::2] for k, v in batch.items()})
                     for i in range(2)])
  _, _, m, _ = one_update(trainer(max_kl=1e-4, grad_accum=2))
  np.testing.assert_allclose(m["proposed_kl"], by_hand, rtol=1e-5)
  assert 0.0 < float(m["update_scale"]) < 1.0


def sharded_update(w, devices, max_kl):
  """(params, metrics) after one trust-region update on a mesh of `devices`."""
  mesh = mesh_lib.make_mesh(w.strategy_args, devices=devices)
  t = Trainer(CFG, w, mesh, pg_loss, total_steps=10, trust_region=(update_kl, max_kl))
  state = t.init_state(initial_params("lm"))
  batch = t.batch_sharding({k: jnp.asarray(v) for k, v in make_batch().items()})
  batch["old_logp"] = t.compute_logprobs(state.params, batch)[0]
  state, metrics = t.update(state, batch, jax.random.PRNGKey(1))
  return jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.parametrize("mesh_name", ["fsdp4_tp2", "dp2_tp2_pp2"])
def test_sharded_trust_region_equals_single_device(mesh_name):
  # The KL measurements and the line search run inside the sharded step (lax.map over
  # the same microbatches, the pipeline schedule for the forwards): same scale, same move.
  max_kl = 1e-4
  want_params, want = sharded_update(worker(), jax.devices()[:1], max_kl)
  assert 0 < want["update_scale"] < 1 and want["proposed_kl"] > max_kl  # the search ran
  got_params, got = sharded_update(worker(**MESHES[mesh_name]), jax.devices(), max_kl)
  for key in ("proposed_kl", "update_scale"):
    assert rel_err(got[key], want[key]) < 1e-5, key
  # The landed KL is ~3e-6 here, a mean of 0.5 d^2 with d ~ 2.5e-3 a difference of log-probs
  # of ~-4.6: float32 gives d to ~1e-6 absolute (any summation order), so the KL to
  # ~|d| 1e-6, not to rel 1e-5 (measured: 2.7e-5 rel on dp2_tp2_pp2).
  d = np.sqrt(2 * want["update_kl"])
  assert abs(got["update_kl"] - want["update_kl"]) <= d * 1e-6
  for a, b in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params)):
    assert rel_err(a, b) < 1e-5
