"""Rollout correction (rollx.algos.correction): the weights of every mode by hand, the
mismatch metrics, `auto`, and the learner's use of them (a real Learner on the default
model): the loss is weighted, masked tokens carry no gradient, and samples with
different behaviour log-probs are not merged."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from rollx import checks, config as config_lib, models
from rollx.algos import correction
from rollx.trainer.learner import Learner

# two sequences of three response tokens after one prompt token; the last id is padding
OLD = np.array([[0.0, -1.0, -2.0, -0.5, 0.0],
                [0.0, -0.2, -0.1, -3.0, 0.0]])
BEHAVIOUR = np.array([[np.nan, -1.0 - np.log(4), -2.0 + np.log(4), -0.5, np.nan],
                      [np.nan, -0.2, np.nan, -3.0 - np.log(1.5), np.nan]])
MASK = np.array([[0, 1, 1, 1, 0], [0, 1, 1, 1, 0]], np.float32)
# w = pi_old / pi_b on the response: 4, 1/4, 1 | 1, unknown (1), 1.5


def weights(mode, c=2.0):
  return correction.importance_weights(mode, OLD, BEHAVIOUR, MASK, c)


def test_token_weights_by_mode():
  applied, raw, changed = weights("none")
  np.testing.assert_allclose(raw[:, 1:4], [[4, 0.25, 1], [1, 1, 1.5]], rtol=1e-6)
  assert (applied == 1).all() and not changed.any()
  applied, _, changed = weights("tis")
  np.testing.assert_allclose(applied[:, 1:4], [[2, 0.25, 1], [1, 1, 1.5]], rtol=1e-6)
  assert changed.sum() == 1 and changed[0, 1]
  applied, _, changed = weights("mis")  # outside [1/2, 2]: 0
  np.testing.assert_allclose(applied[:, 1:4], [[0, 0, 1], [1, 1, 1.5]], rtol=1e-6)
  assert changed.sum() == 2
  applied, _, changed = weights("decoupled")  # above C: 0; below: kept
  np.testing.assert_allclose(applied[:, 1:4], [[0, 0.25, 1], [1, 1, 1.5]], rtol=1e-6)
  assert changed.sum() == 1
  # off the response: 1 whatever the mode
  for mode in correction.MODES:
    assert (weights(mode)[0][:, [0, 4]] == 1).all()


def test_sequence_weights():
  applied, raw, changed = weights("seq_tis", c=1.2)
  # row 0: 4 * 1/4 * 1 = 1; row 1: 1 * 1 * 1.5 = 1.5 -> capped at 1.2 on every token
  np.testing.assert_allclose(raw[:, 1:4], [[1, 1, 1], [1.5, 1.5, 1.5]], rtol=1e-6)
  np.testing.assert_allclose(applied[:, 1:4], [[1, 1, 1], [1.2, 1.2, 1.2]], rtol=1e-6)
  assert changed[1, 1:4].all() and not changed[0].any()


def test_mismatch_metrics_and_lags():
  _, raw, changed = weights("tis")
  versions = np.array([[-1, 3, 3, 3, -1], [-1, 5, 5, 5, -1]])
  m = correction.mismatch_metrics(OLD, BEHAVIOUR, MASK, versions, 5, raw, changed)
  log4, log15 = np.log(4), np.log(1.5)
  # five tokens have a behaviour log-prob (one is unknown)
  assert m["rollout_correction/mismatch_abs"] == pytest.approx((2 * log4 + log15) / 5)
  k3 = lambda lr: np.exp(lr) - 1 - lr
  assert m["rollout_correction/mismatch_k3"] == pytest.approx(
      (k3(log4) + k3(-log4) + k3(log15)) / 5)
  assert m["rollout_correction/weight_mean"] == pytest.approx((4 + 0.25 + 1 + 1 + 1.5) / 5)
  assert m["rollout_correction/weight_max"] == pytest.approx(4)
  assert m["rollout_correction/changed_fraction"] == pytest.approx(1 / 5)
  assert m["rollout_correction/mismatch_abs_lag2"] == pytest.approx(2 * log4 / 3)
  assert m["rollout_correction/mismatch_abs_lag0"] == pytest.approx(log15 / 2)
  assert m["rollout_correction/version_lag_mean"] == pytest.approx(6 / 5)


def test_auto_is_tis_when_off_policy_by_construction():
  c = config_lib.default_config()
  assert correction.resolve(c) == "none"
  c.async_generation_ratio = 1.0
  assert correction.resolve(c) == "tis"
  c.async_generation_ratio = 0.0
  c.actor_infer.generating_args.temperature = 0.7
  assert correction.resolve(c) == "tis"
  c.rollout_correction = "mis"
  assert correction.resolve(c) == "mis"


# each setting that makes the rollouts' data differ from actor_train's policy -> its reason
OFF_POLICY = {
    "async": ({"async_generation_ratio": 1.0}, "async_generation_ratio=1.0 > 0"),
    "temperature": ({"actor_infer.generating_args.temperature": 0.7}, "temperature=0.7 != 1"),
    "top_p": ({"actor_infer.generating_args.top_p": 0.9}, "top_p=0.9 < 1"),
    "top_k": ({"actor_infer.generating_args.top_k": 40}, "top_k=40 > 0"),
    "stale_sync": ({"actor_train.model_update_frequency": 2}, "model_update_frequency=2 > 1"),
    "kept_prefix": ({"actor_infer.strategy_args.keep_prefix_across_updates": True},
                    "keep_prefix_across_updates=True (keys/values of older weights)"),
    "infer_dtype": ({"actor_infer.model_args.dtype": "bf16"},
                    "inference dtype bf16 != training dtype fp32"),
    "low_precision": ({"actor_infer.model_args.dtype": "fp16", "actor_train.model_args.dtype": "fp16"},
                      "inference dtype fp16 (reduced precision)"),
}


@pytest.mark.parametrize("name", list(OFF_POLICY))
def test_auto_corrects_off_policy_data_and_says_why(name):
  settings, reason = OFF_POLICY[name]
  c = config_lib.default_config()
  c.update_from_flattened_dict(settings)
  assert correction.off_policy_reasons(c) == [reason]
  assert correction.resolve(c) == "tis"
  assert correction.start_line(c) == f"rollout correction: tis (auto: {reason})"


def test_the_start_line_of_on_policy_several_reasons_and_a_set_mode():
  c = config_lib.default_config()
  assert correction.start_line(c) == (
      "rollout correction: none (auto: on-policy: synchronous, weights synced every step, "
      "full softmax at temperature 1, fp32 inference as training)")
  c.actor_infer.strategy_args.update(keep_prefix_across_updates=True, reuse_kv=False)
  assert correction.resolve(c) == "none"  # no keys/values kept: the setting is inert
  c.actor_infer.generating_args.top_p = 0.9
  c.actor_train.model_update_frequency = 2
  assert correction.start_line(c) == (
      "rollout correction: tis (auto: top_p=0.9 < 1, model_update_frequency=2 > 1)")
  c.rollout_correction = "none"  # as set, and what it leaves uncorrected
  assert correction.start_line(c) == ("rollout correction: none (rollout_correction=none; "
                                      "off-policy: top_p=0.9 < 1, model_update_frequency=2 > 1)")


# -- the learner ---------------------------------------------------------------------------


def learner(mode):
  c = config_lib.default_config()
  c.custom_envs.FrozenLake = config_lib.env_entry("FrozenLake")
  c.update(max_steps=4, rollout_batch_size=4, sequence_length=16, rollout_correction=mode,
           drop_zero_advantage_samples=True)
  c.train_env_manager.update(group_size=4, num_env_groups=1)
  c.actor_train.device_mapping = (0,)
  c.actor_train.training_args.update(per_device_train_batch_size=4, learning_rate=1e-3,
                                     warmup_steps=0, weight_decay=0.0)
  return Learner(checks.validate(c), models.load_model(None))


def step_samples():
  """Four distinct samples: one minibatch."""
  rng = np.random.default_rng(0)
  samples = {"input_ids": rng.integers(3, 500, (4, 16)).astype(np.int32),
             "segment_ids": np.ones((4, 16), np.int32),
             "response_mask": np.tile((np.arange(16) >= 12).astype(np.float32), (4, 1)),
             "token_versions": np.zeros((4, 16), np.int32)}
  adv = samples["response_mask"] * np.array([[1.0], [-0.5], [2.0], [-1.0]], np.float32)
  return samples, adv


def learn(l, samples, adv, shift):
  """One step's learning with behaviour log-probs `shift` below the policy's own (so
  w = exp(shift) on every response token)."""
  inputs = {k: jnp.asarray(samples[k]) for k in ("input_ids", "segment_ids")}
  own = np.asarray(l.actor.compute_logprobs(l.actor_state.params, inputs)[0])
  samples = dict(samples, behaviour_logp=np.where(samples["response_mask"] > 0, own - shift,
                                                  np.nan).astype(np.float32))
  metrics = {}
  l.learn(types.SimpleNamespace(trajectories=[None] * 4), samples, adv, adv.copy(), 0, metrics)
  return metrics


def test_the_learner_weights_the_loss_and_masks_tokens():
  samples, adv = step_samples()
  plain = learn(learner("none"), samples, adv, 3.0)
  capped = learn(learner("tis"), samples, adv, 3.0)  # w = e^3 -> 2 on every token
  masked = learn(learner("mis"), samples, adv, 3.0)  # w = e^3 outside [1/2, 2]
  for m in (plain, capped, masked):  # measured whatever the mode
    assert m["rollout_correction/mismatch_abs"] == pytest.approx(3.0, rel=1e-5)
    assert m["rollout_correction/version_lag_mean"] == 0
  assert plain["actor/pg_loss"] != 0
  assert capped["actor/pg_loss"] == pytest.approx(2 * plain["actor/pg_loss"], rel=1e-5)
  assert capped["rollout_correction/changed_fraction"] == 1
  assert masked["actor/pg_loss"] == 0 and masked["actor/grad_norm"] == 0


def test_merging_keeps_copies_apart_when_their_weights_differ():
  samples, adv = step_samples()
  for k in samples:  # two pairs of equal samples with equal advantages
    samples[k] = samples[k][[0, 0, 1, 1]]
  adv = adv[[0, 0, 1, 1]]
  inputs = {k: jnp.asarray(samples[k]) for k in ("input_ids", "segment_ids")}
  for mode, distinct in (("none", 0.5), ("tis", 1.0)):
    l = learner(mode)
    own = np.asarray(l.actor.compute_logprobs(l.actor_state.params, inputs)[0])
    shift = np.array([[0.0], [0.5], [0.0], [0.5]])  # copies sampled with other log-probs
    behaviour = np.where(samples["response_mask"] > 0, own - shift, np.nan).astype(np.float32)
    metrics = {}
    l.learn(types.SimpleNamespace(trajectories=[None] * 4),
            dict(samples, behaviour_logp=behaviour), adv, adv.copy(), 0, metrics)
    assert metrics["packing/distinct_samples"] == distinct
