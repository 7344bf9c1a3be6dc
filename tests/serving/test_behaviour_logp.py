"""The servers' behaviour log-probs against the trainer's: a real rollout server (generate
loop, gRPC), the rollout client, the trainer's log-prob pass and the rollout correction.

The shipped default model (its trained weights give the logit scales of a real run),
fp32 on both sides, the same weights, sync: per token, the log-prob the server sampled
with equals the trainer's old log-prob (at the rollout temperature) within 1e-5, and the
importance weights are 1 within 1e-5; at temperature 0.7 too. A stale batch (sampled by
weights some updates older than the trainer's) gives the weights computed by hand.
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rollx import models
from rollx.algos import correction
from rollx.models import llm, logprobs
from rollx.serving.client import RolloutClient
from rollx.serving.engine import RollxEngine, Sampling
from rollx.serving.server import RolloutServer

jax.config.update("jax_default_matmul_precision", "highest")

HOT = 0.7
POLICY = models.load_model(None, dtype="fp32")
MODEL = POLICY.model


def make_params(seed):
  del seed
  return POLICY.params


def prompts(n, seed, lo, hi):
  rng = np.random.default_rng(seed)
  return [[int(t) for t in rng.integers(0, POLICY.config.vocab_size, rng.integers(lo, hi))]
          for _ in range(n)]


@pytest.fixture(scope="module")
def server():
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=8, max_prefill_length=64,
                       max_cache_length=256,
                       sampling={"train": Sampling(1.0), "val": Sampling(HOT)}, seed=3)
  srv = RolloutServer(engine)
  yield srv
  srv.stop()


def sample(server, mode, n=12, max_tokens=16):
  """[(prompt ids, Generation)] for n prompts, sampled concurrently (shared batches)."""
  batch = prompts(n, seed=11, lo=3, hi=40)

  async def go():
    client = RolloutClient([server.address])
    gens = await asyncio.gather(*[client.generate(f"{mode}{i}", p, max_tokens, mode=mode)
                                  for i, p in enumerate(batch)])
    await client.close()
    return gens

  return list(zip(batch, asyncio.run(go())))


WIDTH = 64  # every prompt + response fits: one compiled pass
_logprobs = jax.jit(logprobs.compute_logprobs, static_argnums=(0, 5))
_forward = jax.jit(llm.forward, static_argnums=0)


def padded(ids):
  out, seg = np.zeros((1, WIDTH), np.int32), np.zeros((1, WIDTH), np.int32)
  out[0, :len(ids)], seg[0, :len(ids)] = ids, 1
  return jnp.asarray(out), jnp.asarray(seg)


def trainer_logp(params, prompt, gen, temperature):
  """The trainer's log-prob pass over prompt + response: the response tokens' log-probs."""
  ids, seg = padded(prompt + gen.token_ids)
  logp, _ = _logprobs(MODEL, params, ids, seg, None, temperature)
  return np.asarray(logp)[0, len(prompt):len(prompt) + len(gen.token_ids)]


@pytest.mark.parametrize("mode,temperature", [("train", 1.0), ("val", HOT)])
def test_behaviour_logp_equals_the_trainers_old_logp_in_fp32(server, mode, temperature):
  params = make_params(0)
  for prompt, gen in sample(server, mode):
    assert len(gen.behaviour_logp) == len(gen.token_ids) > 0
    behaviour = np.asarray(gen.behaviour_logp, np.float32)
    old = trainer_logp(params, prompt, gen, temperature)
    np.testing.assert_allclose(behaviour, old, rtol=0, atol=1e-5)
    mask = np.ones((1, len(old)), np.float32)
    for mode_ in ("tis", "seq_tis", "mis", "decoupled"):
      applied, raw, changed = correction.importance_weights(
          mode_, old[None], behaviour[None], mask, threshold=2.0)
      np.testing.assert_allclose(raw, 1.0, rtol=0, atol=1e-5 * (len(old) if mode_ == "seq_tis"
                                                                 else 1))
      np.testing.assert_allclose(applied, raw, rtol=0, atol=0)
      assert not changed.any()


def test_a_stale_batch_gets_the_importance_weights_computed_by_hand(server):
  """The server samples with version 0; the trainer's weights have since moved (three
  updates' worth of drift). w = pi_now(token) / pi_0(token), by hand from the logits."""
  sampled_with = make_params(0)
  noise = llm.init_params(MODEL, jax.random.PRNGKey(99))
  now = jax.tree.map(lambda p, d: p + 3 * 0.05 * d, sampled_with, noise)

  def by_hand(params, prompt, tokens, temperature):
    logits = np.asarray(_forward(MODEL, params, *padded(prompt + tokens)), np.float64)[0]
    z = logits[len(prompt) - 1:len(prompt) + len(tokens) - 1] / temperature
    z -= z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return logp[np.arange(len(tokens)), tokens]

  checked = 0
  for mode, temperature in (("train", 1.0), ("val", HOT)):
    for prompt, gen in sample(server, mode, n=6):
      want = np.exp(by_hand(now, prompt, gen.token_ids, temperature)
                    - by_hand(sampled_with, prompt, gen.token_ids, temperature))
      old = trainer_logp(now, prompt, gen, temperature)
      mask = np.ones((1, len(old)), np.float32)
      behaviour = np.asarray(gen.behaviour_logp, np.float32)[None]
      applied, raw, changed = correction.importance_weights("tis", old[None], behaviour, mask, 2.0)
      np.testing.assert_allclose(raw[0], want, rtol=1e-4)
      np.testing.assert_allclose(applied[0], np.minimum(want, 2.0), rtol=1e-4)
      np.testing.assert_array_equal(changed, raw > 2.0)
      checked += int((want > 1.05).any() or (want < 0.95).any())
  assert checked >= 6  # the drift moved the weights off 1 (a real test of staleness)


def test_behaviour_logp_after_kv_reuse_equals_the_trainers(server):
  """A second turn continued on the first turn's cached keys/values (KV reuse)."""
  params = make_params(0)
  batch = prompts(6, seed=12, lo=3, hi=20)
  before = server.stats()["reused_tokens"]

  async def go():
    client = RolloutClient([server.address])
    first = await asyncio.gather(*[client.generate(f"c{i}/0", p, 8, trajectory_id=f"c{i}")
                                   for i, p in enumerate(batch)])
    second_ids = [p + g.token_ids + [5, 6] for p, g in zip(batch, first)]
    second = await asyncio.gather(*[client.generate(f"c{i}/1", ids, 8, trajectory_id=f"c{i}")
                                    for i, ids in enumerate(second_ids)])
    await client.close()
    return list(zip(second_ids, second))

  turns = asyncio.run(go())
  assert server.stats()["reused_tokens"] - before == sum(len(ids) - 2 for ids, _ in turns)
  for prompt, gen in turns:
    np.testing.assert_allclose(np.asarray(gen.behaviour_logp, np.float32),
                               trainer_logp(params, prompt, gen, 1.0), rtol=0, atol=1e-5)
