"""The serving engine's slot operations (rollx.serving.slot_ops), called directly: no
JetStream, no engine. On a tiny random model in fp32: a prompt prefilled into its slot and
decoded greedily, or continued onto its cached keys/values, gives the logits of a full
forward pass over the same ids (1e-5); the other slots and the padding rows leave the
state untouched; a slot copied into the prefix store's blocks and back is unchanged.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rollx.models import llm
from rollx.serving import slot_ops
from rollx.serving.prefix_store import PREFIX_BLOCK, PrefixStore

jax.config.update("jax_default_matmul_precision", "highest")

CFG = llm.ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
MODEL = llm.make_model(CFG)
PARAMS = llm.init_params(MODEL, jax.random.PRNGKey(0))
SLOTS, CACHE = 3, 100  # CACHE: 2 blocks of the prefix store, the last one part padding
KEY = jax.random.PRNGKey(7)

prefill = jax.jit(functools.partial(slot_ops.prefill_into_slots, MODEL, KEY))
extend = jax.jit(functools.partial(slot_ops.extend_into_slots, MODEL, KEY))
decode = jax.jit(functools.partial(slot_ops.decode_slots, MODEL, jnp.asarray([-1], jnp.int32)))


def empty_state():
  f32 = lambda *shape: jnp.zeros(shape, jnp.float32)
  return slot_ops.SlotState(
      cache=llm.empty_cache(CFG, SLOTS, CACHE), logits=f32(SLOTS, CFG.vocab_size),
      pos=jnp.zeros((SLOTS,), jnp.int32), lengths=jnp.zeros((SLOTS,), jnp.int32),
      done=jnp.ones((SLOTS,), bool), temperature=jnp.ones((SLOTS,), jnp.float32),
      top_p=jnp.ones((SLOTS,), jnp.float32), top_k=jnp.zeros((SLOTS,), jnp.int32),
      keys=jnp.zeros((SLOTS, 2), jnp.uint32))


def rows(slot_n):
  """The per-row arguments after the tokens' own: slot, greedy sampling, seed 0."""
  n = len(slot_n)
  return (np.asarray(slot_n, np.int32), np.zeros((n,), np.float32), np.ones((n,), np.float32),
          np.zeros((n,), np.int32), np.zeros((n,), np.uint32))


def forward_logits(ids):
  """[len(ids), V]: position t's next-token logits given ids[:t + 1]."""
  return np.asarray(llm.forward(MODEL, PARAMS, jnp.asarray([ids], jnp.int32)))[0]


def slot(state, s):
  return jax.tree.map(lambda a: np.asarray(a[:, s] if a.ndim == 5 else a[s]), state)


def assert_same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_prefill_then_greedy_decode_reproduces_the_full_forward_logits():
  prompt = [int(t) for t in np.random.default_rng(0).integers(0, CFG.vocab_size, 11)]
  tokens = np.zeros((2, 16), np.int32)
  tokens[0, :len(prompt)] = prompt
  before = empty_state()
  # row 1 is padding: slot SLOTS is past the last one
  state = prefill(PARAMS, before, tokens, np.asarray([len(prompt), 1], np.int32),
                  *rows([1, SLOTS]))
  for s in (0, 2):  # untouched by the prefill of slot 1 (and by the padding row)
    assert_same(slot(state, s), slot(before, s))
  assert int(state.pos[1]) == len(prompt) and not bool(state.done[1])

  ids, totals, got = list(prompt), jnp.zeros((2,), jnp.float32), [np.asarray(state.logits)[1]]
  for step in range(6):
    state, data, totals = decode(PARAMS, state, totals)
    data = np.asarray(data)
    assert data[1, 0] == np.argmax(got[-1]) and data[1, 1] == 1 and data[1, 2] == step + 1
    assert data[0, 1] == 0 and data[2, 1] == 0  # no request in slots 0 and 2
    ids.append(int(data[1, 0]))
    got.append(np.asarray(state.logits)[1])
  np.testing.assert_allclose(np.stack(got), forward_logits(ids)[len(prompt) - 1:], rtol=0,
                             atol=1e-5)
  assert np.asarray(totals).tolist() == [0.0, 6.0]  # greedy: behaviour log-prob 0


def test_extend_onto_a_slots_cache_equals_a_full_prefill():
  ids = [int(t) for t in np.random.default_rng(1).integers(0, CFG.vocab_size, 16)]
  cached = 9
  tokens = np.zeros((2, 16), np.int32)
  tokens[0, :cached] = ids[:cached]
  state = prefill(PARAMS, empty_state(), tokens, np.asarray([cached, 1], np.int32),
                  *rows([2, SLOTS]))
  new = np.zeros((2, 16), np.int32)
  new[0, :len(ids) - cached] = ids[cached:]
  before = state
  state = extend(PARAMS, state, new, np.asarray([cached, 0], np.int32),
                 np.asarray([len(ids) - cached, 1], np.int32), *rows([2, SLOTS]))
  for s in (0, 1):
    assert_same(slot(state, s), slot(before, s))
  np.testing.assert_allclose(np.asarray(state.logits)[2], forward_logits(ids)[-1], rtol=0,
                             atol=1e-5)
  assert int(state.pos[2]) == len(ids)

  full = np.asarray([ids, [0] * 16], np.int32)
  want = prefill(PARAMS, empty_state(), full, np.asarray([len(ids), 1], np.int32),
                 *rows([2, SLOTS]))
  for got, ref in ((state.cache.k, want.cache.k), (state.cache.v, want.cache.v)):
    np.testing.assert_allclose(np.asarray(got)[:, 2, :, :len(ids)],
                               np.asarray(ref)[:, 2, :, :len(ids)], rtol=0, atol=1e-5)


def test_a_slot_stored_in_blocks_and_loaded_into_another_slot_is_unchanged():
  store = PrefixStore(tokens=4 * PREFIX_BLOCK, max_cache_length=CACHE)
  assert (store.num_blocks, store.blocks_per_slot) == (4, 2)
  rng = np.random.default_rng(2)
  random = lambda: jnp.asarray(rng.normal(size=(CFG.num_layers, SLOTS, CFG.num_kv_heads, CACHE,
                                                CFG.head_dim)), jnp.float32)
  state = dataclasses.replace(empty_state(), cache=llm.KVCache(random(), random()))
  pool = llm.empty_cache(CFG, store.num_blocks, PREFIX_BLOCK)
  blocks = store.block_array([3, 1])  # out of order: a slot's blocks need not be contiguous
  pool = jax.jit(slot_ops.store_slot)(state.cache, pool, np.int32(0), blocks)
  assert not np.asarray(pool.k)[:, [0, 2]].any()  # only the slot's blocks written
  np.testing.assert_array_equal(np.asarray(pool.k)[:, 3],
                                np.asarray(state.cache.k)[:, 0, :, :PREFIX_BLOCK])
  loaded = jax.jit(slot_ops.load_slot)(state, pool, np.int32(1), blocks)
  assert_same(slot(loaded, 1).cache, slot(state, 0).cache)
  for s in (0, 2):
    assert_same(slot(loaded, s), slot(state, s))
  moved = jax.jit(slot_ops.move_slot)(state, np.int32(0), np.int32(2))
  assert_same(slot(moved, 2).cache, slot(state, 0).cache)
  assert_same(slot(moved, 1), slot(state, 1))
