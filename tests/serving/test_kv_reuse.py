"""KV reuse across the turns of a conversation (rollx.serving.engine, llm.extend): exact.

The model (the shipped default): a continuation prefilled onto cached keys/values gives
the logits and keys/values of a full prefill of the same ids (fp32, 1e-5), across
prompt buckets and attention blocks. The server (real generate loop, gRPC): multi-turn conversations
answer exactly what a full decode of the whole conversation gives, reusing every
earlier turn's keys/values; a diverging prefix, a weight update and a slot taken by
another request each fall back to a full prefill and stay exact. With a prefix store,
conversations outnumbering the slots keep their keys/values beside the slots, exactly,
evicted least recently used first under a tiny budget; an ended trajectory's go at once.
"""

import asyncio
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rollx import models
from rollx.models import llm
from rollx.serving.client import RolloutClient
from rollx.serving.engine import RollxEngine, Sampling
from rollx.serving.server import RolloutServer
from tests.serving.test_serving import CFG, MODEL, make_params

jax.config.update("jax_default_matmul_precision", "highest")


@functools.lru_cache(maxsize=None)
def _default_policy():
  # the shipped default model: trained weights, the logit scales of a real run; several
  # query blocks per call. Loaded once for every case.
  return models.load_model(None, attention_block=16)


# jitted: eager op-by-op dispatch of the model made each case ~10x slower
_FORWARD = jax.jit(llm.forward, static_argnums=0)
_EXTEND = jax.jit(llm.extend, static_argnums=0)


@pytest.mark.parametrize("cached,new", [(5, 9), (16, 16), (31, 2), (40, 1), (70, 60)])
def test_extend_equals_a_full_prefill(cached, new):
  policy = _default_policy()
  model, params = policy.model, policy.params
  ids = np.random.default_rng(cached).integers(0, policy.config.vocab_size, cached + new)
  want_logits = np.asarray(_FORWARD(model, params, jnp.asarray(ids[None])))[0]
  _, want_cache = _PREFILL(model, params, jnp.asarray(ids[None]), jnp.asarray([len(ids)]))
  _, cache = _PREFILL(model, params, jnp.asarray(ids[None, :cached]), jnp.asarray([cached]))
  cache = llm.pad_cache(cache, 256)
  width = 1 << max(4, (new - 1).bit_length())  # a bucket, padded
  tokens = np.zeros((1, width), np.int32)
  tokens[0, :new] = ids[cached:]
  last, kv = _EXTEND(model, params, jnp.asarray(tokens), jnp.asarray([cached]),
                     jnp.asarray([new]), cache)
  np.testing.assert_allclose(np.asarray(last)[0], want_logits[-1], rtol=0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(kv.k)[:, 0, :, :new], np.asarray(want_cache.k)[:, 0, :, cached:],
                             rtol=0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(kv.v)[:, 0, :, :new], np.asarray(want_cache.v)[:, 0, :, cached:],
                             rtol=0, atol=1e-5)


def serve(slots=8, store=0):
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=slots, max_prefill_length=128,
                       max_cache_length=256, sampling={"train": Sampling(1.0), "val": Sampling(0.0)},
                       prefix_cache_tokens=store)
  return RolloutServer(engine)


def conversation(client, traj, first, turns, answer=6, rng=None):
  """Greedy turns: each next prompt is the conversation so far + a few new ids."""
  async def go():
    ids, out = list(first), []
    for turn in range(turns):
      gen = await client.generate(f"{traj}/{turn}", ids, answer, trajectory_id=traj, mode="val")
      out.append((list(ids), gen))
      ids = ids + gen.token_ids + [int(t) for t in rng.integers(0, CFG.vocab_size, 3)]
    return out
  return go()


_PREFILL = jax.jit(llm.prefill, static_argnums=0)
_DECODE = jax.jit(llm.decode_step, static_argnums=0)


def greedy(params, prompt, n):
  """A full greedy decode of `prompt` (no reuse), padded to a power of two so that the
  reference compiles once per width, not once per prompt length."""
  width = max(16, 1 << (len(prompt) - 1).bit_length())
  tokens = np.zeros((1, width), np.int32)
  tokens[0, :len(prompt)] = prompt
  logits, cache = _PREFILL(MODEL, params, tokens, np.array([len(prompt)], np.int32))
  cache = llm.pad_cache(cache, width + n)
  out = []
  for i in range(n):
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    out.append(int(token[0]))
    logits, cache = _DECODE(MODEL, params, token, np.array([len(prompt) + i], np.int32), cache)
  return out


def _conversations(srv, n, turns, seed, first_length, rng_base, tag="s"):
  """n greedy conversations at once (`conversation`): conversation i starts with
  first_length(i) ids drawn from `seed` and adds ids drawn from rng_base + i."""
  async def go():
    client = RolloutClient([srv.address])
    rng = np.random.default_rng(seed)
    runs = await asyncio.gather(*[
        conversation(client, f"{tag}{i}", rng.integers(0, 96, first_length(i)), turns,
                     rng=np.random.default_rng(rng_base + i)) for i in range(n)])
    await client.close()
    return runs
  return asyncio.run(go())


def test_multi_turn_conversations_reuse_every_earlier_turn_and_stay_exact():
  srv = serve()
  try:
    runs = _conversations(srv, 4, 3, seed=0, first_length=lambda i: 5 + 9 * i, rng_base=0, tag="t")
    stats = srv.stats()
  finally:
    srv.stop()
  params = make_params(0)
  reusable = 0
  for turns in runs:
    for k, (prompt, gen) in enumerate(turns):
      assert gen.token_ids == greedy(params, prompt, 6)
      if k:  # the previous turn's prompt + response
        reusable += len(turns[k - 1][0]) + len(turns[k - 1][1].token_ids)
  assert stats["reused_tokens"] == reusable
  assert stats["prefilled_tokens"] + stats["reused_tokens"] == sum(
      len(p) for turns in runs for p, _ in turns)


def test_as_many_conversations_as_slots_keep_every_cache():
  """8 conversations on 8 slots, their turns arriving together: each turn takes the slot
  that holds its conversation, so every turn after the first reuses all of the last one."""
  srv = serve(slots=8)
  try:
    runs = _conversations(srv, 8, 4, seed=1, first_length=lambda i: 7 + i, rng_base=10, tag="c")
    stats = srv.stats()
  finally:
    srv.stop()
  first_turns = sum(len(turns[0][0]) for turns in runs)
  new_ids = 3 * 3 * 8  # 3 later turns x 3 new ids x 8 conversations
  assert stats["prefilled_tokens"] == first_turns + new_ids


def test_a_diverging_prefix_a_weight_update_and_a_reused_slot_fall_back_exactly():
  srv = serve(slots=2)
  client = RolloutClient([srv.address])
  try:
    async def turn(traj, ids, tag):
      return await client.generate(tag, ids, 6, trajectory_id=traj, mode="val")

    first = [3, 14, 15, 92, 65, 35]
    a = asyncio.run(turn("a", first, "a0"))
    # a diverging prefix (one id of the cached conversation changed): full prefill
    before = srv.stats()["reused_tokens"]
    changed = [first[0] + 1] + first[1:] + a.token_ids + [7]
    b = asyncio.run(turn("a", changed, "a1"))
    assert srv.stats()["reused_tokens"] == before
    assert b.token_ids == greedy(make_params(0), changed, 6)
    # a weight update between two turns: the new turn is prefilled under the new weights
    new = make_params(1)
    srv.update_params(new, 1)
    ids = changed + b.token_ids + [8, 9]
    c = asyncio.run(turn("a", ids, "a2"))
    assert srv.stats()["reused_tokens"] == before and set(c.token_versions) == {1}
    assert c.token_ids == greedy(new, ids, 6)
    # ... and the turn after reuses what was computed under them
    ids = ids + c.token_ids + [10]
    d = asyncio.run(turn("a", ids, "a3"))
    assert srv.stats()["reused_tokens"] == before + len(ids) - 1
    assert d.token_ids == greedy(new, ids, 6)
    # other requests take both slots: the conversation's slot is reused, its keys/values gone
    async def others():
      await asyncio.gather(turn("x", [1, 2, 3], "x"), turn("y", [4, 5, 6], "y"),
                           turn("z", [7, 8], "z"))
    asyncio.run(others())
    before = srv.stats()["reused_tokens"]
    ids = ids + d.token_ids + [11]
    e = asyncio.run(turn("a", ids, "a4"))
    assert e.token_ids == greedy(new, ids, 6)
    assert srv.stats()["reused_tokens"] == before
  finally:
    srv.stop()


def test_keep_prefix_across_updates_reuses_stale_keys_and_reports_their_age():
  """With keep_prefix_across_updates a weight update keeps the cached conversation: the
  next turn prefills only its new ids, the stale ids are counted, and the response's
  policy version is the oldest weights that touched it (its tokens: the new ones)."""
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=2, max_prefill_length=128,
                       max_cache_length=256, sampling={"train": Sampling(1.0), "val": Sampling(0.0)},
                       keep_prefix_across_updates=True)
  srv = RolloutServer(engine)
  client = RolloutClient([srv.address])
  try:
    async def turn(ids, tag):
      return await client.generate(tag, ids, 6, trajectory_id="a", mode="val")

    first = [3, 14, 15, 92, 65, 35]
    a = asyncio.run(turn(first, "a0"))
    assert a.policy_version == 0 and srv.stats()["stale_reused_tokens"] == 0
    srv.update_params(make_params(1), 1)
    ids = first + a.token_ids + [7, 8]
    b = asyncio.run(turn(ids, "a1"))
    cached = len(first) + len(a.token_ids)
    stats = srv.stats()
    assert stats["reused_tokens"] == cached and stats["prefilled_tokens"] == len(first) + 2
    assert stats["stale_reused_tokens"] == cached and stats["max_prefix_staleness"] == 1
    assert set(b.token_versions) == {1} and b.policy_version == 0
    # the next turn, no update in between: the old ids are still stale, the new ones not
    ids = ids + b.token_ids + [9]
    c = asyncio.run(turn(ids, "a2"))
    assert srv.stats()["stale_reused_tokens"] == 2 * cached and c.policy_version == 0
    # off (the default), the same update means a full prefill (the test above)
  finally:
    srv.stop()


def _assert_exact(runs):
  params = make_params(0)
  for turns in runs:
    for prompt, gen in turns:
      assert gen.token_ids == greedy(params, prompt, 6)


def test_prefix_store_keeps_conversations_that_outnumber_the_slots():
  """6 conversations on 2 slots: a turn whose slot went to another request continues
  from the store, exactly, and every later turn reuses all of the turn before."""
  srv = serve(slots=2, store=4096)
  try:
    runs = _conversations(srv, 6, 3, seed=30, first_length=lambda i: 9 + 3 * i, rng_base=30)
    stats = srv.stats()
  finally:
    srv.stop()
  _assert_exact(runs)
  reusable = sum(len(t[k - 1][0]) + len(t[k - 1][1].token_ids) for t in runs for k in (1, 2))
  assert stats["store_reused_tokens"] > 0 and stats["store_evictions"] == 0
  assert stats["reused_tokens"] == reusable


def test_prefix_store_evicts_the_least_recently_used_under_a_tiny_budget():
  """One slot, a store of one block: b's turn moves a to the store, c's moves b there and
  evicts a. b continues from the store; a is prefilled whole. Both exact."""
  srv = serve(slots=1, store=64)
  try:
    async def go():
      client = RolloutClient([srv.address])
      turn = lambda t, ids, tag: client.generate(tag, ids, 6, trajectory_id=t, mode="val")
      first = {"a": [1, 2, 3, 4], "b": [5, 6, 7], "c": [8, 9]}
      out = {t: await turn(t, ids, f"{t}0") for t, ids in first.items()}
      assert srv.stats()["store_evictions"] == 1  # c's turn evicted a for b
      before = srv.stats()
      b_ids = first["b"] + out["b"].token_ids + [10]
      b1 = await turn("b", b_ids, "b1")
      middle = srv.stats()
      a_ids = first["a"] + out["a"].token_ids + [11]
      a1 = await turn("a", a_ids, "a1")
      after = srv.stats()
      await client.close()
      return (b_ids, b1, a_ids, a1), (before, middle, after)
    (b_ids, b1, a_ids, a1), (before, middle, after) = asyncio.run(go())
  finally:
    srv.stop()
  params = make_params(0)
  assert b1.token_ids == greedy(params, b_ids, 6) and a1.token_ids == greedy(params, a_ids, 6)
  assert middle["store_reused_tokens"] - before["store_reused_tokens"] == len(b_ids) - 1
  assert after["reused_tokens"] == middle["reused_tokens"]  # a: a full prefill


def test_an_ended_trajectory_is_dropped_from_its_slot_and_the_store():
  srv = serve(slots=1, store=1024)
  try:
    async def go():
      client = RolloutClient([srv.address])
      a = await client.generate("a0", [1, 2, 3, 4], 6, trajectory_id="a", mode="val")
      b = await client.generate("b0", [5, 6, 7], 6, trajectory_id="b", mode="val")  # a -> store
      stored = srv.stats()["stored_tokens"]
      await client.end_trajectory("a")
      await client.end_trajectory("b")  # b's keys/values are in the slot
      for _ in range(100):  # (handled on the generate loop's thread)
        if srv.stats()["stored_tokens"] == 0 and not srv.engine.slot_for(
            type("R", (), {"trajectory_id": "b"})()):
          break
        await asyncio.sleep(0.01)
      # a new turn of "b" finds nothing to continue: a full prefill
      before = srv.stats()["reused_tokens"]
      await client.generate("b1", [5, 6, 7] + b.token_ids + [8], 6, trajectory_id="b", mode="val")
      await client.close()
      return a, stored, srv.stats()["reused_tokens"] - before
    a, stored, reused = asyncio.run(go())
    assert stored == 4 + len(a.token_ids)
    assert srv.stats()["stored_tokens"] == 0 and reused == 0
  finally:
    srv.stop()
