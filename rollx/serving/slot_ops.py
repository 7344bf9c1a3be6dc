"""The device side of rollx's serving engine: the decode state of its slots and the
pure functions that act on it (prefill or continue prompts into slots, sample and decode
one token for every slot, move or copy a slot's keys/values). `RollxEngine` jits them
with the model and its static settings bound; they need no JetStream, so they can be
called and tested on their own.

The state holds `slots` rows: a KV cache `[L, slots, K, max_cache_length, hd]` (slot s,
position p at index p), each slot's next-token logits, write position and sampling
settings. A row index >= slots in a prefill or extend is a padding row: the scatters
drop it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from rollx.models import llm


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
  cache: llm.KVCache
  logits: jax.Array  # [S, V] f32
  pos: jax.Array  # [S] next cache index to write (= tokens in the cache)
  lengths: jax.Array  # [S] tokens generated for the slot's request
  done: jax.Array  # [S] a stop id was emitted
  temperature: jax.Array  # [S]
  top_p: jax.Array  # [S]
  top_k: jax.Array  # [S]
  # [S, 2] uint32: the slot's request's sampling key; token i is drawn with
  # fold_in(key, i), so a request's samples do not depend on what else is in the batch
  keys: jax.Array


def sample_tokens(logits_sv, temperature_s, top_p_s, top_k_s, keys_s):
  """Per-slot temperature / top-k / top-p sampling, row s with key keys_s[s];
  temperature 0 = argmax.

  Returns (tokens, behaviour log-probs): the log-prob of each token under the
  distribution it was drawn from, i.e. softmax(logits / T) truncated to the top-k / top-p
  set and renormalised (0 under greedy decoding, a point mass). The trainer's log-prob
  pass computes log softmax(logits / T) over the whole vocabulary: the two agree exactly
  when top-k / top-p are off, and the difference under truncation is the behaviour
  side's business (rollout correction reweights by it).
  """
  v = logits_sv.shape[-1]
  greedy = temperature_s <= 0
  scaled = logits_sv / jnp.where(greedy, 1.0, temperature_s)[:, None]

  def filtered():
    sorted_desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(top_k_s > 0, jnp.minimum(top_k_s, v), v)
    kth = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    # keep the smallest prefix of the sorted tokens whose mass reaches top_p
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = (mass_before < top_p_s[:, None]) | (top_p_s[:, None] >= 1.0)
    pth = jnp.min(jnp.where(keep_sorted, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where((scaled >= kth) & (scaled >= pth), scaled, -jnp.inf)

  # The vocabulary sort is the costliest part of a decode step on small models:
  # only pay for it when some slot asks for top-k / top-p.
  needs_filter = jnp.any((top_k_s > 0) | (top_p_s < 1.0))
  masked = jax.lax.cond(needs_filter, filtered, lambda: scaled)
  sampled = jax.vmap(jax.random.categorical)(keys_s, masked)
  tokens = jnp.where(greedy, jnp.argmax(logits_sv, axis=-1), sampled).astype(jnp.int32)
  logp = jnp.take_along_axis(jax.nn.log_softmax(masked, axis=-1), tokens[:, None], axis=-1)[:, 0]
  return tokens, jnp.where(greedy, 0.0, logp)


def request_keys(base_key: jax.Array, seed_n):
  """The sampling key of each request from its seed: fold_in(base_key, seed)."""
  return jax.vmap(jax.random.fold_in, (None, 0))(base_key, seed_n)


def _start_requests(state: SlotState, base_key, logits, pos_n, slot_n, temp_n, top_p_n,
                    top_k_n, seed_n) -> SlotState:
  """`state` with fresh requests in `slot_n`: their next-token logits, write position,
  sampling settings and key; nothing generated yet."""
  at = lambda a, x: a.at[slot_n].set(jnp.asarray(x).astype(a.dtype), mode="drop")
  return dataclasses.replace(
      state, logits=at(state.logits, logits), pos=at(state.pos, pos_n),
      lengths=at(state.lengths, 0), done=at(state.done, False),
      temperature=at(state.temperature, temp_n), top_p=at(state.top_p, top_p_n),
      top_k=at(state.top_k, top_k_n), keys=at(state.keys, request_keys(base_key, seed_n)))


def prefill_into_slots(model: llm.Transformer, base_key: jax.Array, params, state: SlotState,
                       tokens_nt, true_length_n, slot_n, temp_n, top_p_n, top_k_n,
                       seed_n) -> SlotState:
  """Prefills n prompts at once into their slots (their keys/values at positions 0...,
  their last logits stored for the next decode step)."""
  logits, cache = llm.prefill(model, params, tokens_nt, true_length_n)  # cache [L,n,K,T,hd]
  t = tokens_nt.shape[1]
  rows = lambda full, part: full.at[:, slot_n, :, :t].set(part.astype(full.dtype), mode="drop")
  state = dataclasses.replace(
      state, cache=llm.KVCache(rows(state.cache.k, cache.k), rows(state.cache.v, cache.v)))
  return _start_requests(state, base_key, logits, true_length_n, slot_n, temp_n, top_p_n,
                         top_k_n, seed_n)


def extend_into_slots(model: llm.Transformer, base_key: jax.Array, params, state: SlotState,
                      tokens_nt, start_n, length_n, slot_n, temp_n, top_p_n, top_k_n,
                      seed_n, read_len: Optional[int] = None) -> SlotState:
  """Continues n conversations whose slots hold their first `start` ids' keys/values:
  the new ids are prefilled onto them at positions start, start + 1, ... (llm.extend).
  `read_len` (static, >= every start): the cached positions read, not the allocation."""
  slots, s = state.cache.k.shape[1], state.cache.k.shape[3]
  k, v = state.cache.k, state.cache.v
  rows = jnp.minimum(slot_n, slots - 1)
  read = s if read_len is None else min(int(read_len), s)
  logits, new = llm.extend(model, params, tokens_nt, start_n, length_n,
                           llm.KVCache(k[:, rows, :, :read], v[:, rows, :, :read]))
  t = tokens_nt.shape[1]
  pos_nt = jnp.minimum(start_n[:, None] + jnp.arange(t)[None, :], s)  # s: dropped
  # [L, n, K, T, hd] -> [n, T, L, K, hd]: the advanced indices (slot, position) first
  write = lambda full, part: full.at[:, slot_n[:, None], :, pos_nt].set(
      part.transpose(1, 3, 0, 2, 4).astype(full.dtype), mode="drop")
  state = dataclasses.replace(state, cache=llm.KVCache(write(k, new.k), write(v, new.v)))
  return _start_requests(state, base_key, logits, start_n + length_n, slot_n, temp_n, top_p_n,
                         top_k_n, seed_n)


def move_slot(state: SlotState, source, slot) -> SlotState:
  """A conversation's keys/values from slot `source` to `slot` (its next turn's)."""
  move = lambda full: full.at[:, slot].set(full[:, source])
  return dataclasses.replace(state, cache=llm.KVCache(move(state.cache.k),
                                                      move(state.cache.v)))


def decode_slots(model: llm.Transformer, stop_ids: jax.Array, params, state: SlotState,
                 logp_totals, read_len: Optional[int] = None):
  """One generate step for every slot: samples a token from its stored logits and feeds
  it through the model (next logits, cache write). `read_len` (static): the cache
  positions attention reads (`llm.decode_step`), at least every live slot's position.

  Returns (the new state, data [S, 4] int32: token, valid, length and the behaviour
  log-prob's float32 bits, logp_totals + [sum of the emitted tokens' log-probs, their
  count]). A slot that samples one of `stop_ids` is done from the next step on.
  """
  keys = jax.vmap(jax.random.fold_in)(state.keys, state.lengths)
  tokens, logp = sample_tokens(state.logits, state.temperature, state.top_p, state.top_k, keys)
  valid = ~state.done
  lengths = state.lengths + 1
  done = state.done | jnp.isin(tokens, stop_ids)
  logits, cache = llm.decode_step(model, params, tokens, state.pos, state.cache, read_len)
  new = dataclasses.replace(
      state, cache=cache, logits=logits.astype(jnp.float32),
      pos=jnp.minimum(state.pos + 1, state.cache.k.shape[3] - 1), lengths=lengths, done=done)
  # column 3: the behaviour log-prob's float32 bits (ResultTokens names columns 0-2)
  data = jnp.stack([tokens, valid.astype(jnp.int32), lengths,
                    jax.lax.bitcast_convert_type(logp.astype(jnp.float32), jnp.int32)], axis=1)
  # Emitted tokens' log-probs (slots without a live request included: the
  # generate loop, not the engine, knows which slots are live).
  stats = jnp.stack([jnp.sum(jnp.where(valid, logp, 0.0)), jnp.sum(valid).astype(jnp.float32)])
  return new, data, logp_totals + stats


def store_slot(cache: llm.KVCache, pool: llm.KVCache, slot, blocks) -> llm.KVCache:
  """A slot's keys/values into the `pool` blocks `blocks` ([blocks per slot]; entries
  past the pool are padding, dropped). `pool` is `[L, blocks, K, block, hd]`."""
  bps, block, cache_len = blocks.shape[0], pool.k.shape[3], cache.k.shape[3]

  def one(full, part):
    row = full[:, slot]  # [L, K, T, hd]
    row = jnp.pad(row, ((0, 0), (0, 0), (0, bps * block - cache_len), (0, 0)))
    l, k, _, hd = row.shape
    row = row.reshape(l, k, bps, block, hd).transpose(0, 2, 1, 3, 4)  # [L, bps, K, B, hd]
    return part.at[:, blocks].set(row.astype(part.dtype), mode="drop")
  return llm.KVCache(one(cache.k, pool.k), one(cache.v, pool.v))


def load_slot(state: SlotState, pool: llm.KVCache, slot, blocks) -> SlotState:
  """The `pool` blocks `blocks` into `slot` (positions past the conversation get whatever
  the padding blocks hold: never attended, since a slot attends below its position)."""
  bps, block, cache_len = blocks.shape[0], pool.k.shape[3], state.cache.k.shape[3]

  def one(full, part):
    rows = part[:, jnp.minimum(blocks, part.shape[1] - 1)]  # [L, bps, K, B, hd]
    l, _, k, _, hd = rows.shape
    row = rows.transpose(0, 2, 1, 3, 4).reshape(l, k, bps * block, hd)[:, :, :cache_len]
    return full.at[:, slot].set(row.astype(full.dtype))
  return dataclasses.replace(state, cache=llm.KVCache(one(state.cache.k, pool.k),
                                                      one(state.cache.v, pool.v)))
