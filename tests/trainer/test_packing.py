"""Sequence packing: exact round trips, rows never overflow, log-probs unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rollx.models import llm, logprobs
from rollx.trainer import packing


def _samples(n=23, width=64, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, width + 1, n)
  ids = np.zeros((n, width), np.int32)
  for i, k in enumerate(lengths):
    ids[i, :k] = rng.integers(1, 100, k)
  return lengths, ids


def test_pack_unpack_round_trip_and_rows_fit():
  lengths, ids = _samples()
  p = packing.plan(lengths, 64, row_multiple=4)
  packed = p.pack(ids)
  assert packed.shape == (p.num_rows, 64) and p.num_rows % 4 == 0
  assert p.num_rows < len(lengths)  # it does pack
  np.testing.assert_array_equal(p.unpack(packed), ids)
  seg = p.segment_ids()
  for r in range(p.num_rows):  # segments are contiguous, numbered 1.. in order
    row = seg[r][seg[r] > 0]
    assert list(dict.fromkeys(row)) == list(range(1, len(set(row)) + 1))
  assert (seg > 0).sum() == lengths.sum()
  np.testing.assert_array_equal(p.unpack(seg > 0), ids > 0)


def test_no_packing_is_one_sample_per_row():
  lengths, ids = _samples(n=5)
  p = packing.plan(lengths, 64, row_multiple=4, pack=False)
  assert p.num_rows == 8
  np.testing.assert_array_equal(p.pack(ids)[:5], ids)
  assert (p.segment_ids()[5:] == 0).all()


def test_too_long_sample_is_named():
  with pytest.raises(ValueError, match="sequence_length=8"):
    packing.plan([3, 9], 8)


def _tiny_model_and_packed_samples():
  """A random tiny policy and 9 samples packed into rows of 48 tokens."""
  config = llm.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
  model = llm.make_model(config)
  params = llm.init_params(model, jax.random.PRNGKey(0))
  lengths, ids = _samples(n=9, width=48, seed=1)
  return model, params, lengths, ids % config.vocab_size, packing.plan(lengths, 48)


def test_logprobs_on_packed_rows_equal_per_sample_rows():
  model, params, lengths, ids, p = _tiny_model_and_packed_samples()
  seg = (np.arange(48)[None] < lengths[:, None]).astype(np.int32)
  want, want_ent = logprobs.compute_logprobs(model, params, jnp.asarray(ids), jnp.asarray(seg))
  got, got_ent = logprobs.compute_logprobs(model, params, jnp.asarray(p.pack(ids)),
                                           jnp.asarray(p.segment_ids()))
  mask = seg > 0
  np.testing.assert_allclose(p.unpack(np.asarray(got))[mask], np.asarray(want)[mask], atol=1e-5)
  np.testing.assert_allclose(p.unpack(np.asarray(got_ent))[mask], np.asarray(want_ent)[mask],
                             atol=1e-5)


@pytest.mark.parametrize("rows,want", [(130, (144, 48)), (128, (128, 64)), (64, (64, 64)),
                                       (65, (96, 48)), (1, (16, 16)), (0, (16, 16))])
def test_rows_split_into_equal_minibatches_with_little_padding(rows, want):
  # 130 rows used to be padded to 192 (three minibatches of 64, a third of them empty)
  assert packing.split_rows(rows, 64, 16) == want
  total, size = want
  assert total % size == 0 and size % 16 == 0 and size <= 64
  assert total - rows < 16 * (total // size) or rows == 0  # under one granule per minibatch


def test_granule_must_divide_the_minibatch():
  with pytest.raises(ValueError, match="granule 24"):
    packing.split_rows(10, 64, 24)


def test_score_positions_lists_each_rows_response_tokens():
  mask = np.zeros((3, 40), np.float32)
  mask[0, [3, 4, 9]] = 1
  mask[2, 5:14] = 1
  got = packing.score_positions(mask)
  assert got.shape == (3, 16)  # 9 in row 2 -> the next power of two
  np.testing.assert_array_equal(got[0, :4], [3, 4, 9, 40])
  assert (got[1] == 40).all()
  np.testing.assert_array_equal(got[2, :9], np.arange(5, 14))
  assert packing.score_positions(np.ones((2, 40), np.float32)) is None  # K 64 > half of 40


def test_scored_logprobs_and_gradient_equal_the_full_head():
  model, params, lengths, ids, p = _tiny_model_and_packed_samples()
  seg = p.segment_ids()
  # the last three tokens of every sample are its response
  resp = np.zeros_like(ids, np.float32)
  for i, k in enumerate(lengths):
    resp[i, max(k - 3, 1):k] = 1
  mask = p.pack(resp)
  score = packing.score_positions(mask)
  assert score is not None
  adv = np.random.default_rng(2).normal(size=mask.shape).astype(np.float32)
  args = (jnp.asarray(p.pack(ids)), jnp.asarray(seg))

  def loss(params, score_bk):
    logp, ent = logprobs.compute_logprobs(model, params, *args, score_bk)
    return jnp.sum((logp * adv + 0.1 * ent) * mask), (logp, ent)

  (l_full, (lp_full, ent_full)), g_full = jax.value_and_grad(loss, has_aux=True)(params, None)
  (l_sc, (lp_sc, ent_sc)), g_sc = jax.value_and_grad(loss, has_aux=True)(
      params, jnp.asarray(score))
  on = mask > 0
  np.testing.assert_allclose(np.asarray(lp_sc)[on], np.asarray(lp_full)[on], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(ent_sc)[on], np.asarray(ent_full)[on], rtol=1e-5,
                             atol=1e-6)
  assert (np.asarray(lp_sc)[~on] == 0).all() and (np.asarray(ent_sc)[~on] == 0).all()
  np.testing.assert_allclose(float(l_sc), float(l_full), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_sc), jax.tree.leaves(g_full)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_min_minibatches_keeps_the_update_count():
  # 20 merged rows where the unmerged step had two minibatches: still two updates
  assert packing.split_rows(20, 64, 16, min_minibatches=2) == (32, 16)
  assert packing.split_rows(130, 64, 16, min_minibatches=2) == (144, 48)  # already 3


def _duplicated_samples():
  """9 distinct samples, some repeated (15 in all), 3-token responses, one advantage per
  sample: copies of sample 0 disagree in sign, copies of 2, 5 and 8 agree."""
  model, params, lengths, ids, _ = _tiny_model_and_packed_samples()
  src = np.array([0, 3, 0, 1, 2, 2, 0, 2, 4, 5, 5, 6, 7, 8, 8])
  adv_n = np.array([0.5, 0.9, 1.2, -0.4, -1.0, -0.3, -0.7, -2.0, 0.8, 1.5, 0.2, -1.1, 0.6,
                    -0.9, -0.1], np.float32)
  resp = np.zeros_like(ids, np.float32)
  for i, k in enumerate(lengths):
    resp[i, max(k - 3, 1):k] = 1
  resp = resp[src]
  return model, params, lengths[src], ids[src], resp, adv_n[:, None] * resp


def test_merge_identical_groups_equal_tokens_of_one_sign():
  _, _, lengths, ids, resp, adv = _duplicated_samples()
  m = packing.merge_identical(ids, lengths, resp, adv)
  # 0 splits by sign (+0.5, +1.2 | -0.7); 2 (x3, all -), 5 (x2, +), 8 (x2, -) merge
  np.testing.assert_array_equal(m.index, [0, 1, 3, 4, 6, 8, 9, 11, 12, 13])
  np.testing.assert_array_equal(m.weight, [2, 1, 1, 3, 1, 1, 2, 1, 1, 2])
  np.testing.assert_allclose(m.advantages[0][resp[0] > 0], 0.85)
  np.testing.assert_allclose(m.advantages[3][resp[4] > 0], -1.1, rtol=1e-6)
  assert m.weight.sum() == len(lengths)


def _moved(params, scale: float):
  """`params` moved by noise: a rollout or reference policy whose ratios to `params`
  land on both sides of the clip."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape)
                                   for x, k in zip(leaves, keys)])


def _actor_loss_and_grad(c, model, params, samples, adv, width=None):
  """actor_loss (config `c`) and its gradient on `samples`: packed into rows of `width`
  tokens, or one sample a row when `width` is None."""
  from rollx.algos import losses
  lengths = samples["segment_ids"].sum(axis=1)
  if width is None:
    batch = {k: jnp.asarray(samples[k]) for k in ("input_ids", "segment_ids", "response_mask")}
    batch["advantages"] = jnp.asarray(adv)
  else:
    p = packing.plan(lengths, width)
    batch = {"input_ids": jnp.asarray(p.pack(samples["input_ids"])),
             "segment_ids": jnp.asarray(p.segment_ids()),
             "response_mask": jnp.asarray(p.pack(samples["response_mask"])),
             "advantages": jnp.asarray(p.pack(adv))}
  for name, ps in (("old_logp", _moved(params, 0.15)), ("ref_logp", _moved(params, 0.3))):
    batch[name] = logprobs.compute_logprobs(model, ps, batch["input_ids"],
                                            batch["segment_ids"])[0]
  (loss, metrics), grads = jax.value_and_grad(
      lambda q: losses.actor_loss(c, model, q, batch, None), has_aux=True)(params)
  return loss, metrics, grads


@pytest.mark.parametrize("dual_clip", [False, True])
def test_merged_samples_give_the_actor_loss_and_gradient_of_all_copies(dual_clip):
  from rollx import config as rollx_config
  model, params, lengths, ids, resp, adv = _duplicated_samples()
  c = rollx_config.default_config()
  c.use_kl_loss, c.kl_loss_coef, c.entropy_loss_coef = True, 0.3, 0.01
  c.dual_clip_loss, c.pg_clip = dual_clip, 0.1
  samples = {"input_ids": ids, "response_mask": resp,
             "segment_ids": (np.arange(ids.shape[1])[None] < lengths[:, None]).astype(np.int32)}
  loss, metrics, grads = _actor_loss_and_grad(c, model, params, samples, adv, 48)
  assert 0 < float(metrics["clip_fraction"]) < 1
  merged_samples, merged_adv, _, m = packing.merge_samples(samples, adv, adv)
  assert len(m.index) == 10
  loss_m, metrics_m, grads_m = _actor_loss_and_grad(c, model, params, merged_samples,
                                                    merged_adv, 48)
  np.testing.assert_allclose(float(loss_m), float(loss), rtol=1e-5)
  for k in ("pg_loss", "kl_loss", "entropy", "clip_fraction", "approx_kl"):
    np.testing.assert_allclose(float(metrics_m[k]), float(metrics[k]), rtol=1e-5, err_msg=k)
  for a, b in zip(jax.tree.leaves(grads_m), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_seq_mean_token_mean_packed_and_merged_gives_the_one_sample_a_row_loss():
  # what Learner.learn does under seq-mean-token-mean: per-sample token weights, merged
  # copies, packed rows, the loss bound to token-mean; against that mode's own loss with
  # one sample a row. Responses of 1-3 tokens: unweighted packing would count a long
  # response's tokens more.
  from rollx import config as rollx_config
  from rollx.trainer import learner
  model, params, lengths, ids, resp, adv = _duplicated_samples()
  adv_n = adv.sum(axis=1) / resp.sum(axis=1)
  resp = np.zeros_like(resp)
  for i, k in enumerate(lengths):
    resp[i, k - 1 - k % 4:k] = 1
  assert len(set(resp.sum(axis=1))) >= 3
  adv = adv_n[:, None] * resp
  c = rollx_config.default_config()
  c.use_kl_loss, c.kl_loss_coef, c.entropy_loss_coef = True, 0.3, 0.01
  c.pg_clip, c.loss_agg_mode = 0.1, "seq-mean-token-mean"
  samples = {"input_ids": ids, "response_mask": resp,
             "segment_ids": (np.arange(ids.shape[1])[None] < lengths[:, None]).astype(np.int32)}
  loss, metrics, grads = _actor_loss_and_grad(c, model, params, samples, adv)
  weighted = dict(samples, response_mask=packing.per_sample_mean_weights(resp))
  merged_samples, merged_adv, _, m = packing.merge_samples(weighted, adv, adv)
  assert len(m.index) < len(lengths)
  packed_c = learner.loss_config(c)
  assert packed_c.loss_agg_mode == "token-mean" and c.loss_agg_mode == "seq-mean-token-mean"
  loss_p, metrics_p, grads_p = _actor_loss_and_grad(packed_c, model, params, merged_samples,
                                                    merged_adv, 48)
  np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-5)
  for k in ("pg_loss", "kl_loss", "entropy"):
    np.testing.assert_allclose(float(metrics_p[k]), float(metrics[k]), rtol=1e-5, err_msg=k)
  for a, b in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  # and token-mean over the same packed rows without the weights is a different loss
  loss_t, _, _ = _actor_loss_and_grad(packed_c, model, params, samples, adv, 48)
  assert abs(float(loss_t) - float(loss)) > 1e-3


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_minibatch_split_1_2_4_ways_gives_the_one_pass_loss_and_gradient(mode):
  # rows of unequal response lengths (and one with none): an unweighted mean over
  # microbatches would weight the tokens of a short microbatch more
  import functools
  from rollx import config as rollx_config
  from rollx.algos import losses
  from rollx.parallel import mesh as mesh_lib
  from rollx.trainer.step import Trainer
  from tests.parallel.test_sharding import CFG, initial_params, make_batch, worker
  jax.config.update("jax_default_matmul_precision", "highest")
  c = rollx_config.default_config()
  c.loss_agg_mode, c.use_kl_loss, c.kl_loss_coef, c.entropy_loss_coef = mode, True, 0.2, 0.01
  batch = make_batch(b=8)
  batch["response_mask"][:4, 5:9] = 0  # microbatches of 2 ways differ in token count
  batch["response_mask"][6] = 0
  rng = np.random.default_rng(3)
  batch["old_logp"] = -rng.random(batch["response_mask"].shape).astype(np.float32)
  batch["ref_logp"] = -rng.random(batch["response_mask"].shape).astype(np.float32)
  params = initial_params("lm")
  results = []
  for k in (1, 2, 4):
    w = worker(grad_accum=k)
    trainer = Trainer(CFG, w, mesh_lib.make_mesh(w.strategy_args, devices=jax.devices()[:1]),
                      functools.partial(losses.actor_loss, c), 10,
                      weight_fn=functools.partial(losses.loss_weight, mode))
    loss, grads, _ = jax.jit(trainer.grads)(params, {k_: jnp.asarray(v) for k_, v in batch.items()},
                                            jax.random.PRNGKey(0))
    results.append((float(loss), jax.device_get(grads)))
  for loss, grads in results[1:]:
    np.testing.assert_allclose(loss, results[0][0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(results[0][1])):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * np.abs(b).max())
