"""A google-jetstream `Engine` for rollx models: prefill, insert, generate.

The decode state holds `max_concurrent_decodes` slots: a KV cache
`[L, slots, K, max_cache_length, hd]` (slot row s, position p at index p), the
next-token logits of every slot, its write position, and its sampling settings.

- `prefill` takes one prompt (padded to a power-of-two bucket) and stages it: no
  model call yet (as in JetStream 0.2.2's API, prefill emits no token: the first
  token comes from the next `generate`).
- `insert` assigns a staged prompt to a slot with its sampling settings (train or
  validation: requests of both kinds share the batch) and its sampling key (from the
  request's id: token i is drawn with fold_in(key, i), so a request's tokens do not
  depend on the batch it shares or on when it arrived); host-side bookkeeping only.
- `generate` first prefills every prompt inserted since the last step, in batches
  of `prefill_batch` rows (their KV caches written into their slots, their last
  logits stored), then samples one token for every slot from its stored logits and
  runs one decode step with it (next logits, cache write). A sampled stop
  id is returned as a normal token (trajectories must contain exactly what the
  model produced, EOS included); the slot reports `valid = 0` from the next step
  on (rollx.serving.batching ends the request at the stop id itself).

KV reuse across turns (`reuse_kv`): an agent's every turn sends the whole
conversation so far. When a request names its trajectory (`trajectory_id`) and its
ids start with the previous turn's prompt and response, whose keys/values that turn's
slot still holds, only the new ids are prefilled (`llm.extend`), onto those keys/values
(moved into the request's slot at insert). Checked id by id; exact: the cached keys/values must
come from the weights that will sample (a weight update since they were computed, or
the slot given to another request, means a full prefill). With
`keep_prefix_across_updates` a weight update keeps them: each cached id is tagged with the
weights version that computed its keys/values, the request's prefill version is the
oldest of them (so the response's policy version, and the trainer's off-policy
correction, see the staleness), and the engine counts the stale ids it reused
(`stale_reused_tokens`, `max_prefix_staleness`). Entries live in the slots
themselves: the generate loop gives a request its conversation's slot when that is
free, and otherwise the slot freed longest ago. When a slot holding a finished
conversation is given to another request, the conversation moves to the prefix store
(`prefix_cache_tokens`: a pool of fixed-size blocks beside the slots, least recently used
conversation evicted first; 0 = none), from where its next turn is copied back into a
slot. So a server keeps more conversations than it has slots, and the slots (whose count
sets the cost of every decode step) can be sized for the requests in flight alone. A
trajectory that ended (`end_trajectory`: the env manager says so) is dropped from both.

Why prefill is deferred into `generate`: the newcomers of a step are prefilled
together, in as few calls as their buckets allow, instead of one call per request
(JetStream 0.2.2's orchestrator prefills one request per call on its own thread; with
short multi-turn prompts that chain, not the model, set the rate).

Weights: the engine serves a `VersionedParams` container; `update_params` swaps its
contents under a lock and every generate call reads the current (version, params) pair
once. A swap therefore lands between two generate steps, never inside one. The engine
records the version used by each generate step, so a response can report the version of
every token it contains; each step's output also carries the behaviour log-prob of every
sampled token (under the distribution it was drawn from), which the learner's rollout
correction compares with its own.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import threading
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rollx.models import llm
from rollx.parallel import partition
from rollx.serving import compat

compat.apply()
from jetstream.engine import engine_api, tokenizer_api, tokenizer_pb2  # noqa: E402

from rollx.serving import PREFILL_BUCKETS  # noqa: E402

# Attention keys per prefill call at most (rows x keys per row; `RollxEngine._rows`): 8
# rows of up to 1024 tokens, fewer for longer buckets and for continuations (whose
# queries also attend to the slot's cache). Measured on configs/sokoban.py:multiturn
# (4096-token buckets, the default model): prefills of 2 rows instead of 8 took the
# server's peak RSS from 4.5 to 3.3 GB, continuations of 1 row instead of 2 from 2.7 to
# 1.8 GB (with rollx.serving.compat keeping TensorFlow out).
PREFILL_TOKENS = 8192
# Tokens per block of the prefix store: a conversation takes ceil(ids / block) blocks.
PREFIX_BLOCK = 64


def prefill_bucket(n: int) -> int:
  """The padded width of n prompt (or continuation) ids: the smallest prefill bucket that fits."""
  return PREFILL_BUCKETS[bisect.bisect_left(PREFILL_BUCKETS, n)]


@dataclasses.dataclass(frozen=True)
class Sampling:
  temperature: float = 1.0  # 0 = greedy
  top_p: float = 1.0
  top_k: int = 0  # 0 = off

  @classmethod
  def from_generating_args(cls, g) -> "Sampling":
    return cls(float(g.temperature), float(g.top_p), int(g.top_k))


class VersionedParams:
  """The weights an engine serves: (version, params), swapped atomically."""

  def __init__(self, params, version: int = 0):
    self._lock = threading.Lock()
    self._current = (int(version), params)

  def get(self) -> Tuple[int, Any]:
    with self._lock:
      return self._current

  def set(self, params, version: int) -> None:
    with self._lock:
      self._current = (int(version), params)

  @property
  def version(self) -> int:
    return self.get()[0]


@dataclasses.dataclass
class Prefix:
  """A staged prompt (the next `generate` prefills it). Plain Python, not a pytree,
  so request metadata can ride along."""
  tokens: np.ndarray  # [bucket] int32, padded to a prefill bucket
  true_length: int
  request: Any = None  # set by the server (see server.RollxRequest)


@dataclasses.dataclass
class _Conversation:
  """The ids whose keys/values a slot holds for a trajectory: its last request's prompt
  and, once that request finished, its response. Valid while the slot is not given to
  another request and the weights have not changed since step `since`."""
  trajectory_id: str
  ids: np.ndarray
  since: int  # the generate step that computed the oldest of these keys/values
  request: Any
  finished: bool = False
  # per id: the weights version that computed its keys/values (-1 until prefilled)
  versions: Optional[np.ndarray] = None


@dataclasses.dataclass
class _Staged:
  slot: int
  prefix: Prefix
  sampling: Sampling
  seed: int = 0  # the request's sampling seed (uint32)
  start: int = 0  # > 0: the keys/values of ids [0, start) are in the slot (KV reuse)
  conversation: Optional[_Conversation] = None
  cached_versions: Optional[np.ndarray] = None  # versions of the reused ids [0, start)
  from_store: bool = False  # the reused keys/values were copied back from the prefix store


@dataclasses.dataclass
class _Stored:
  """A finished conversation moved out of its slot into the prefix store's blocks."""
  conversation: _Conversation
  blocks: List[int]


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


class TokenIdsTokenizer(tokenizer_api.Tokenizer):
  """What JetStream's Engine API asks of a tokenizer, for token-id requests.

  Stops are the engine's job (see module doc), so `stop_tokens` is empty.
  `encode`/`decode` go through the HF tokenizer for text requests and logging.
  """

  def __init__(self, hf_tokenizer, pad_id: int):
    self._tok, self._pad = hf_tokenizer, pad_id

  def encode(self, s: str, **kwargs):
    from jetstream.engine import token_utils
    # a text request is outside text: no special token it spells is a control token
    ids = np.asarray(self._tok.encode(s, split_special_tokens=True), np.int32)
    return token_utils.pad_tokens(ids, self.bos_id, self.pad_id, is_bos=False,
                                  max_prefill_length=kwargs.get("max_prefill_length"),
                                  jax_padding=kwargs.get("jax_padding", True))

  def decode(self, token_ids: list[int], **kwargs) -> str:
    return self._tok.decode(token_ids) if self._tok is not None else ""

  @property
  def pad_id(self) -> int:
    return self._pad

  @property
  def eos_id(self) -> int:
    return self._pad

  @property
  def bos_id(self) -> int:
    return self._pad

  @property
  def stop_tokens(self) -> set[int]:
    return set()


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


class RollxEngine(engine_api.Engine):

  def __init__(self, model: llm.Transformer, params, *, version: int = 0,
               max_concurrent_decodes: int = 32, max_prefill_length: int = 512,
               max_cache_length: int = 1024, stop_token_ids: Sequence[int] = (),
               sampling: Optional[dict] = None, hf_tokenizer=None, pad_id: int = 0,
               mesh: Optional[Mesh] = None, seed: int = 0, prefill_batch: int = 8,
               reuse_kv: bool = True, keep_prefix_across_updates: bool = False,
               prefix_cache_tokens: int = 0):
    if max_prefill_length not in PREFILL_BUCKETS:
      raise ValueError(f"max_prefill_length={max_prefill_length} must be one of "
                       f"{PREFILL_BUCKETS} (JetStream's padding buckets)")
    if max_cache_length < max_prefill_length:
      raise ValueError(f"max_cache_length={max_cache_length} < max_prefill_length="
                       f"{max_prefill_length}")
    self.model, self.config = model, model.config
    self._mesh = mesh or Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1, 1),
                              ("pipeline", "data", "fsdp", "tensor"))
    self.params_holder = VersionedParams(self._place(params), version)
    self._slots = int(max_concurrent_decodes)
    self._prefill_batch = max(1, min(int(prefill_batch), self._slots))
    self._max_prefill = int(max_prefill_length)
    self.max_cache_length = int(max_cache_length)
    self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
    self.sampling = dict(sampling or {"train": Sampling(), "val": Sampling(temperature=0.0)})
    self._hf_tokenizer, self._pad_id = hf_tokenizer, int(pad_id)
    self._base_key = jax.random.PRNGKey(seed)
    self._anonymous_requests = 0
    # Version of every generate step, stored as change points (first step, version):
    # versions change once per weight sync, steps run forever.
    self.num_steps = 0
    self._version_starts: List[int] = []
    self._versions: List[int] = []
    # KV reuse across turns: slot -> the conversation whose keys/values it holds, and
    # trajectory -> its slot
    self.reuse_kv = bool(reuse_kv)
    self.keep_prefix_across_updates = bool(keep_prefix_across_updates)
    self.stale_reused_tokens = 0  # reused ids computed by older weights than the sampling's
    self.max_prefix_staleness = 0  # the largest version gap of a reused id
    self._conversations: Dict[int, _Conversation] = {}
    self._slot_of: Dict[str, int] = {}
    self._conversation_lock = threading.Lock()
    # The prefix store: trajectory -> its blocks, least recently used first
    self._blocks_per_slot = -(-self.max_cache_length // PREFIX_BLOCK)
    self._num_blocks = int(prefix_cache_tokens) // PREFIX_BLOCK if self.reuse_kv else 0
    self._store: "collections.OrderedDict[str, _Stored]" = collections.OrderedDict()
    self._free_blocks: List[int] = list(range(self._num_blocks))
    self.store_evictions = 0  # conversations evicted from the store for room
    self.store_reused_tokens = 0  # reused ids copied back from the store
    self.prefilled_tokens = 0  # prompt tokens run through the model
    self.reused_tokens = 0  # prompt tokens whose keys/values were reused instead
    stop = jnp.asarray(self.stop_token_ids or (-1,), jnp.int32)

    def request_keys(seed_n):
      return jax.vmap(jax.random.fold_in, (None, 0))(self._base_key, seed_n)

    def prefill_into_slots(params, state: SlotState, tokens_nt, true_length_n, slot_n, temp_n,
                           top_p_n, top_k_n, seed_n):
      """Prefills n prompts at once into their slots; rows with slot >= slots are padding
      (dropped by the scatters)."""
      logits, cache = llm.prefill(model, params, tokens_nt, true_length_n)  # cache [L,n,K,T,hd]
      t = tokens_nt.shape[1]
      at = lambda a, x: a.at[slot_n].set(jnp.asarray(x).astype(a.dtype), mode="drop")
      rows = lambda full, part: full.at[:, slot_n, :, :t].set(part.astype(full.dtype), mode="drop")
      return dataclasses.replace(
          state, cache=llm.KVCache(rows(state.cache.k, cache.k), rows(state.cache.v, cache.v)),
          logits=at(state.logits, logits), pos=at(state.pos, true_length_n),
          lengths=at(state.lengths, 0), done=at(state.done, False),
          temperature=at(state.temperature, temp_n), top_p=at(state.top_p, top_p_n),
          top_k=at(state.top_k, top_k_n), keys=at(state.keys, request_keys(seed_n)))

    def move_slot(state: SlotState, source, slot):
      """A conversation's keys/values from slot `source` to `slot` (its next turn's)."""
      move = lambda full: full.at[:, slot].set(full[:, source])
      return dataclasses.replace(state, cache=llm.KVCache(move(state.cache.k),
                                                          move(state.cache.v)))

    def extend_into_slots(params, state: SlotState, tokens_nt, start_n, length_n, slot_n,
                          temp_n, top_p_n, top_k_n, seed_n):
      """Continues n conversations whose slots hold their first `start` ids' keys/values:
      the new ids are prefilled onto them at positions start, start + 1, ...
      (llm.extend). Rows with slot >= slots are padding."""
      s = state.cache.k.shape[3]
      k, v = state.cache.k, state.cache.v
      rows = jnp.minimum(slot_n, self._slots - 1)
      logits, new = llm.extend(model, params, tokens_nt, start_n, length_n,
                               llm.KVCache(k[:, rows], v[:, rows]))
      t = tokens_nt.shape[1]
      pos_nt = jnp.minimum(start_n[:, None] + jnp.arange(t)[None, :], s)  # s: dropped
      # [L, n, K, T, hd] -> [n, T, L, K, hd]: the advanced indices (slot, position) first
      write = lambda full, part: full.at[:, slot_n[:, None], :, pos_nt].set(
          part.transpose(1, 3, 0, 2, 4).astype(full.dtype), mode="drop")
      at = lambda a, x: a.at[slot_n].set(jnp.asarray(x).astype(a.dtype), mode="drop")
      return dataclasses.replace(
          state, cache=llm.KVCache(write(k, new.k), write(v, new.v)),
          logits=at(state.logits, logits), pos=at(state.pos, start_n + length_n),
          lengths=at(state.lengths, 0), done=at(state.done, False),
          temperature=at(state.temperature, temp_n), top_p=at(state.top_p, top_p_n),
          top_k=at(state.top_k, top_k_n), keys=at(state.keys, request_keys(seed_n)))

    bps, block, cache_len = self._blocks_per_slot, PREFIX_BLOCK, self.max_cache_length

    def store_slot(cache: llm.KVCache, pool: llm.KVCache, slot, blocks):
      """A slot's keys/values into the store's `blocks` ([blocks per slot]; out-of-range
      entries are padding, dropped)."""
      def one(full, part):
        row = full[:, slot]  # [L, K, T, hd]
        row = jnp.pad(row, ((0, 0), (0, 0), (0, bps * block - cache_len), (0, 0)))
        l, k, _, hd = row.shape
        row = row.reshape(l, k, bps, block, hd).transpose(0, 2, 1, 3, 4)  # [L, bps, K, B, hd]
        return part.at[:, blocks].set(row.astype(part.dtype), mode="drop")
      return llm.KVCache(one(cache.k, pool.k), one(cache.v, pool.v))

    def load_slot(state: SlotState, pool: llm.KVCache, slot, blocks):
      """The store's `blocks` into `slot` (positions past the conversation get whatever
      the padding blocks hold: never attended, since a slot attends below its position)."""
      def one(full, part):
        rows = part[:, jnp.minimum(blocks, part.shape[1] - 1)]  # [L, bps, K, B, hd]
        l, _, k, _, hd = rows.shape
        row = rows.transpose(0, 2, 1, 3, 4).reshape(l, k, bps * block, hd)[:, :, :cache_len]
        return full.at[:, slot].set(row.astype(full.dtype))
      return dataclasses.replace(state, cache=llm.KVCache(one(state.cache.k, pool.k),
                                                          one(state.cache.v, pool.v)))

    def generate_fn(params, state: SlotState, logp_totals):
      keys = jax.vmap(jax.random.fold_in)(state.keys, state.lengths)
      tokens, logp = sample_tokens(state.logits, state.temperature, state.top_p, state.top_k, keys)
      valid = ~state.done
      lengths = state.lengths + 1
      done = state.done | jnp.isin(tokens, stop)
      logits, cache = llm.decode_step(model, params, tokens, state.pos, state.cache)
      new = dataclasses.replace(
          state, cache=cache, logits=logits.astype(jnp.float32),
          pos=jnp.minimum(state.pos + 1, self.max_cache_length - 1), lengths=lengths,
          done=done)
      # column 3: the behaviour log-prob's float32 bits (ResultTokens names columns 0-2)
      data = jnp.stack([tokens, valid.astype(jnp.int32), lengths,
                        jax.lax.bitcast_convert_type(logp.astype(jnp.float32), jnp.int32)], axis=1)
      # Emitted tokens' log-probs (slots without a live request included: the
      # generate loop, not the engine, knows which slots are live).
      stats = jnp.stack([jnp.sum(jnp.where(valid, logp, 0.0)), jnp.sum(valid).astype(jnp.float32)])
      return new, data, logp_totals + stats

    # Every slot array is replicated over the server's mesh (the slots live with the
    # tensor-sharded weights), pinned on outputs too: a fresh state and a step's output
    # then hit the same compiled program (otherwise each variant compiles twice).
    self._replicated = NamedSharding(self._mesh, P())
    self._logp_totals = jax.device_put(jnp.zeros((2,), jnp.float32), self._replicated)
    self._staged: List[_Staged] = []  # inserted since the last generate step
    # Prefill and decode are separate programs: the decode step compiles once, the
    # prefill once per prompt bucket, always `prefill_batch` rows (more newcomers take
    # several calls, fewer are padded). A row-count variant per bucket would cost 1-5 s
    # of compile each on a 2-core CPU, in every test that starts a server; a padded
    # row costs little next to the per-call overhead at these sizes. `warmup` compiles
    # ahead where a first-batch stall matters.
    self._prefill = jax.jit(prefill_into_slots, donate_argnums=1, out_shardings=self._replicated)
    self._extend = jax.jit(extend_into_slots, donate_argnums=1, out_shardings=self._replicated)
    self._move = jax.jit(move_slot, donate_argnums=0, out_shardings=self._replicated)
    self._generate = jax.jit(generate_fn, donate_argnums=1, out_shardings=self._replicated)
    self._store_slot = jax.jit(store_slot, donate_argnums=1, out_shardings=self._replicated)
    self._load_slot = jax.jit(load_slot, donate_argnums=0, out_shardings=self._replicated)
    self._pool = None
    if self._num_blocks:
      shape = (self.config.num_layers, self._num_blocks, self.config.num_kv_heads, PREFIX_BLOCK,
               self.config.head_dim)
      zeros = lambda: jnp.zeros(shape, self.model.dtype)
      self._pool = jax.device_put(llm.KVCache(zeros(), zeros()), self._replicated)

  # -- weights ---------------------------------------------------------------
  def _place(self, params):
    return jax.device_put(params, partition.param_shardings(params, self._mesh))

  def update_params(self, params, version: int) -> None:
    """Swap in new weights; the next prefill / generate step uses them."""
    self.params_holder.set(self._place(params), version)

  def version_at(self, step: int) -> int:
    return self._versions[bisect.bisect_right(self._version_starts, step) - 1]

  def versions_of(self, first_step: Optional[int], num_tokens: int) -> List[int]:
    """Policy version of each of a request's tokens: the weights whose logits it was
    sampled from. Step t samples token t - first_step from the logits of the step
    before (its decode step), except the first token, sampled from its prefill at
    `first_step`: after a weight swap at step t, token t still comes from the old
    weights."""
    if first_step is None or num_tokens == 0:
      return []
    return [self.version_at(first_step)] + [
        self.version_at(t - 1) for t in range(first_step + 1, first_step + num_tokens)]

  def sampled_logprob_stats(self) -> Tuple[float, int]:
    """(sum of emitted tokens' behaviour log-probs, their count) since the engine started; kept on
    device and added asynchronously, so reading it is the only host sync."""
    totals = np.asarray(self._logp_totals)
    return float(totals[0]), int(totals[1])

  # -- engine_api.Engine --------------------------------------------------------
  def prefill(self, *, params: VersionedParams, existing_prefix=None, padded_tokens,
              true_length: int) -> Prefix:
    if existing_prefix is not None:
      raise NotImplementedError("rollx reuses a trajectory's keys/values at insert (by "
                                "trajectory and ids), not through existing_prefix")
    del params  # the generate step that prefills it reads the weights then
    return Prefix(tokens=np.asarray(padded_tokens, np.int32), true_length=int(true_length))

  def insert(self, prefix: Prefix, decode_state: SlotState, slot: int) -> SlotState:
    request = prefix.request
    sampling = getattr(request, "sampling", None) or self.sampling["train"]
    if request is not None:  # the next generate step prefills it and samples its first token
      request.first_step, request.slot = self.num_steps, int(slot)
    staged, source, evicted, stored = self._continuation(int(slot), prefix, sampling)
    if evicted is not None:  # the slot's previous conversation into the store first
      self._pool = self._store_slot(decode_state.cache, self._pool, np.int32(slot),
                                    self._block_array(evicted.blocks))
    if stored is not None:  # this conversation back from the store
      decode_state = self._load_slot(decode_state, self._pool, np.int32(slot),
                                     self._block_array(stored.blocks))
      staged.from_store = True
      with self._conversation_lock:  # (dispatched: a later store into them runs after)
        self._free_blocks.extend(stored.blocks)
    elif staged.start and source != slot:
      # moved now, before anything is prefilled into `source` (the generate loop may
      # give it to another request of this very step)
      decode_state = self._move(decode_state, np.int32(source), np.int32(slot))
    self._staged.append(staged)
    return decode_state

  def _block_array(self, blocks: Sequence[int]) -> np.ndarray:
    out = np.full((self._blocks_per_slot,), self._num_blocks, np.int32)  # padding: dropped
    out[:len(blocks)] = blocks
    return out

  # -- KV reuse across turns -------------------------------------------------------------
  def _continuation(self, slot: int, prefix: Prefix, sampling: Sampling):
    """What `slot`'s prefill needs: (staged, the slot holding the keys/values it continues
    from, the store entry made for the slot's previous conversation or None, the store
    entry it continues from or None). The whole prompt is prefilled unless the
    trajectory's previous turn left the keys/values of a prefix of these very ids (checked
    id by id) in a slot or in the store; then only the ids after it. The slot's previous
    conversation moves to the store (when there is one, and it finished), else is gone."""
    staged, source = _Staged(slot, prefix, sampling, self._sampling_seed(prefix.request)), slot
    trajectory = getattr(prefix.request, "trajectory_id", "")
    ids = np.asarray(prefix.tokens[:prefix.true_length])
    stored = evicted = None
    with self._conversation_lock:
      previous = self._conversations.get(self._slot_of.get(trajectory, -1)) if trajectory else None
      entry = self._store.pop(trajectory, None) if trajectory and previous is None else None
      candidate = previous if entry is None else entry.conversation
      if (self.reuse_kv and candidate is not None and candidate.finished
          and len(candidate.ids) < len(ids) and np.array_equal(ids[:len(candidate.ids)], candidate.ids)):
        staged.start = len(candidate.ids)
        staged.cached_versions = candidate.versions
        if entry is None:
          source = self._slot_of[trajectory]
          del self._conversations[source]
        else:
          stored = entry
      elif entry is not None:  # a store entry this turn does not continue: useless now
        self._free_blocks.extend(entry.blocks)
      dropped = self._conversations.pop(slot, None)
      if dropped is not None and self._slot_of.get(dropped.trajectory_id) == slot:
        del self._slot_of[dropped.trajectory_id]
        if dropped.finished and dropped.trajectory_id != trajectory:
          evicted = self._keep_in_store(dropped)
      if trajectory:
        since = candidate.since if staged.start else self.num_steps
        staged.conversation = self._conversations[slot] = _Conversation(
            trajectory, ids, since, prefix.request)
        self._slot_of[trajectory] = slot
    return staged, source, evicted, stored

  def _keep_in_store(self, conversation: _Conversation) -> Optional[_Stored]:
    """Blocks for `conversation` in the prefix store (evicting the least recently used
    entries as needed), or None when the store is off or too small for it."""
    need = -(-len(conversation.ids) // PREFIX_BLOCK)
    if need > self._num_blocks:
      return None
    while len(self._free_blocks) < need:
      if not self._store:  # (the blocks a turn is being copied back from are not free yet)
        return None
      _, old = self._store.popitem(last=False)
      self._free_blocks.extend(old.blocks)
      self.store_evictions += 1
    blocks, self._free_blocks = self._free_blocks[:need], self._free_blocks[need:]
    entry = self._store[conversation.trajectory_id] = _Stored(conversation, blocks)
    return entry

  def end_trajectory(self, trajectory: str) -> Optional[int]:
    """`trajectory` ended: its keys/values are dropped from its slot or the store. Returns
    the slot that held them (now the best one to give away), or None."""
    with self._conversation_lock:
      entry = self._store.pop(trajectory, None)
      if entry is not None:
        self._free_blocks.extend(entry.blocks)
      slot = self._slot_of.get(trajectory)
      conversation = self._conversations.get(slot)
      if conversation is None or not conversation.finished:
        return None  # (a request of it is still running: its slot is not free anyway)
      del self._conversations[slot], self._slot_of[trajectory]
      return slot

  @property
  def stored_tokens(self) -> int:
    """Ids whose keys/values the prefix store holds."""
    with self._conversation_lock:
      return sum(len(e.conversation.ids) for e in self._store.values())

  def _sampling_seed(self, request) -> int:
    """A request's sampling seed: from its id (and sampling mode) when it has one, so
    that its tokens depend on the engine's seed, the request and the weights only, not on
    what else shares the batch or when it arrived (a retried request draws the same);
    else a fresh number."""
    name = getattr(request, "request_id", "")
    if name:
      return zlib.crc32(f"{getattr(request, 'mode', '')}/{name}".encode())
    self._anonymous_requests += 1
    return zlib.crc32(f"#{self._anonymous_requests}".encode())

  def slot_for(self, request) -> Optional[int]:
    """The slot holding `request`'s trajectory's finished previous turn, if any."""
    trajectory = getattr(request, "trajectory_id", "")
    slot = self._slot_of.get(trajectory) if trajectory else None
    conversation = self._conversations.get(slot)
    return slot if conversation is not None and conversation.finished else None

  def finish(self, request, response_ids: Sequence[int]) -> None:
    """`request` completed with `response_ids`: its slot now holds the keys/values of
    its prompt and response, which the trajectory's next turn may continue from."""
    with self._conversation_lock:
      conversation = self._conversations.get(getattr(request, "slot", None))
      if conversation is not None and conversation.request is request:
        conversation.ids = np.concatenate([conversation.ids,
                                           np.asarray(response_ids, conversation.ids.dtype)])
        if self.keep_prefix_across_updates:  # per-id versions: only stale reuse reads them
          conversation.versions = np.concatenate([
              conversation.versions if conversation.versions is not None
              else np.full(len(conversation.ids) - len(response_ids), -1, np.int32),
              self._kv_versions(getattr(request, "first_step", None), len(response_ids))])
        conversation.finished = True

  def _kv_versions(self, first_step: Optional[int], num_tokens: int) -> np.ndarray:
    """The weights version that computed each response token's keys/values: token i is
    fed through the model by the step after the one that sampled it (first_step + i + 1;
    the current weights when that step has not run yet)."""
    if first_step is None or not self._versions:
      return np.full(num_tokens, -1, np.int32)
    return np.array([self.version_at(t) if t < self.num_steps else self._versions[-1]
                     for t in range(first_step + 1, first_step + num_tokens + 1)], np.int32)

  def _unchanged_since(self, step: int, version: int) -> bool:
    """Whether every generate step from `step` on, and the one about to run with
    `version`, used the same weights (a reused key/value is exact only then)."""
    return not self._versions or (self._versions[-1] == version
                                  and self._version_starts[-1] <= step)

  def warmup(self, prompt_buckets: Sequence[int]) -> None:
    """Compiles the decode step and the prefill for these prompt buckets (prompts are
    padded to `PREFILL_BUCKETS`), on a scratch decode state."""
    weights = self.params_holder.get()[1]
    state = self.init_decode_state()
    state, _, totals = self._generate(weights, state, self._logp_totals)
    for width in prompt_buckets:  # every row is padding (slot out of range): state unchanged
      n = self._rows(width)
      pad = np.full((n,), self._slots, np.int32)  # out-of-range slots: padding rows
      sampling = (np.ones((n,), np.float32), np.ones((n,), np.float32), np.zeros((n,), np.int32),
                  np.zeros((n,), np.uint32))
      state = self._prefill(weights, state, np.zeros((n, width), np.int32),
                            np.ones((n,), np.int32), pad, *sampling)
      if self.reuse_kv:  # a continuation's new ids take the same buckets
        n = self._rows(width, extend=True)
        state = self._extend(weights, state, np.zeros((n, width), np.int32),
                             np.zeros((n,), np.int32), np.ones((n,), np.int32),
                             np.full((n,), self._slots, np.int32), np.ones((n,), np.float32),
                             np.ones((n,), np.float32), np.zeros((n,), np.int32),
                             np.zeros((n,), np.uint32))
    if self.reuse_kv:
      state = self._move(state, np.int32(0), np.int32(0))
    if self._pool is not None:  # all-padding blocks: the store is unchanged
      self._pool = self._store_slot(state.cache, self._pool, np.int32(0), self._block_array(()))
      state = self._load_slot(state, self._pool, np.int32(0), self._block_array(()))
    jax.block_until_ready((state, totals))

  def _rows(self, width: int, extend: bool = False) -> int:
    """Rows per prefill call of this width: `prefill_batch`, fewer for long prompts
    (at most PREFILL_TOKENS keys a call: a call's activations and attention scores, not
    the weights, set a server's peak memory; a continuation's queries also attend to
    its slot's whole cache)."""
    keys = width + (self.max_cache_length if extend else 0)
    return max(1, min(self._prefill_batch, PREFILL_TOKENS // keys))

  def _chunks(self, staged: Sequence[_Staged], width_of, extend: bool = False):
    """`staged` in calls of one width each, `_rows(width)` rows at most: (width, chunk)."""
    by_width: Dict[int, List[_Staged]] = {}
    for s in staged:
      by_width.setdefault(width_of(s), []).append(s)
    for width in sorted(by_width):
      group, n = by_width[width], self._rows(width, extend)
      for i in range(0, len(group), n):
        yield width, group[i:i + n]

  def _extend_arrays(self, width: int, chunk: Sequence[_Staged]):
    """Continuations as `_rows(width, extend=True)` rows: their new ids (padded to
    `width`), where they start, how many, their slot, sampling."""
    n = self._rows(width, extend=True)
    tokens = np.full((n, width), self._pad_id, np.int32)
    start, length = np.zeros((n,), np.int32), np.ones((n,), np.int32)
    slot = np.full((n,), self._slots, np.int32)
    for i, s in enumerate(chunk):
      new = s.prefix.tokens[s.start:s.prefix.true_length]
      tokens[i, :len(new)] = new
      start[i], length[i], slot[i] = s.start, len(new), s.slot
    return (tokens, start, length, slot) + self._sampling_arrays(n, chunk)

  @staticmethod
  def _sampling_arrays(n: int, chunk: Sequence[_Staged]):
    """Per row: temperature, top-p, top-k, the request's sampling seed (padding: off)."""
    temp, top_p = np.ones((n,), np.float32), np.ones((n,), np.float32)
    top_k, seed = np.zeros((n,), np.int32), np.zeros((n,), np.uint32)
    for i, s in enumerate(chunk):
      temp[i], top_p[i], top_k[i] = s.sampling.temperature, s.sampling.top_p, s.sampling.top_k
      seed[i] = s.seed
    return temp, top_p, top_k, seed

  def _chunk_arrays(self, width: int, chunk: Sequence[_Staged]):
    """Staged prompts as `_rows(width)` padded numpy rows (numpy, not jnp: an eager jnp
    op is a dispatch of its own, queued behind the running step)."""
    n = self._rows(width)
    tokens = np.full((n, width), self._pad_id, np.int32)
    true_length = np.ones((n,), np.int32)
    slot = np.full((n,), self._slots, np.int32)  # out of range: padding rows are dropped
    for i, s in enumerate(chunk):
      tokens[i, :len(s.prefix.tokens)] = s.prefix.tokens
      true_length[i], slot[i] = s.prefix.true_length, s.slot
    return (tokens, true_length, slot) + self._sampling_arrays(n, chunk)

  def generate(self, params: VersionedParams, decode_state: SlotState):
    version, weights = params.get()
    staged, self._staged = self._staged, []
    stale_since: Dict[int, int] = {}  # staged index -> the oldest version it reuses
    for i, s in enumerate(staged):
      if s.start and not self._unchanged_since(s.conversation.since, version):
        cached = s.cached_versions
        if self.keep_prefix_across_updates and cached is not None and len(cached) >= s.start:
          oldest = int(cached[:s.start].min())
          stale_since[i] = oldest
          self.stale_reused_tokens += int(np.sum(cached[:s.start] != version))
          self.max_prefix_staleness = max(self.max_prefix_staleness, version - oldest)
        else:  # the weights changed since the prefix was computed: prefill it all again
          s.start, s.conversation.since = 0, self.num_steps
    # Same-bucket prompts share a call (each is padded to its bucket).
    for width, chunk in self._chunks([s for s in staged if not s.start],
                                     lambda s: len(s.prefix.tokens)):
      decode_state = self._prefill(weights, decode_state, *self._chunk_arrays(width, chunk))
    for width, chunk in self._chunks([s for s in staged if s.start],
                                     lambda s: prefill_bucket(s.prefix.true_length - s.start), True):
      decode_state = self._extend(weights, decode_state, *self._extend_arrays(width, chunk))
    self.prefilled_tokens += sum(s.prefix.true_length - s.start for s in staged)
    self.reused_tokens += sum(s.start for s in staged)
    self.store_reused_tokens += sum(s.start for s in staged if s.from_store)
    # the running totals go through the jitted step: an eager add here cost ~1 ms a step
    decode_state, data, self._logp_totals = self._generate(weights, decode_state,
                                                           self._logp_totals)
    for i, s in enumerate(staged):  # the weights that prefilled it, not those at staging
      if s.prefix.request is not None:  # (kept stale keys/values: the oldest among them)
        s.prefix.request.prefill_version = min(version, stale_since.get(i, version))
      if s.conversation is not None and self.keep_prefix_across_updates:
        reused = (s.cached_versions[:s.start] if s.start and s.cached_versions is not None
                  else np.zeros((0,), np.int32))
        s.conversation.versions = np.concatenate([
            reused.astype(np.int32), np.full(len(s.conversation.ids) - len(reused), version,
                                             np.int32)])
    if not self._versions or self._versions[-1] != version:
      self._version_starts.append(self.num_steps)
      self._versions.append(version)
    self.num_steps += 1
    return decode_state, engine_api.ResultTokens(
        data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3), samples_per_slot=1)

  def load_params(self, *args, **kwargs) -> VersionedParams:
    return self.params_holder

  def get_prefix_destination_sharding(self) -> Any:
    return None

  def get_tokenizer(self) -> tokenizer_pb2.TokenizerParameters:
    return tokenizer_pb2.TokenizerParameters()

  def build_tokenizer(self, metadata) -> TokenIdsTokenizer:
    return TokenIdsTokenizer(self._hf_tokenizer, self._pad_id)

  def init_decode_state(self, *args, **kwargs) -> SlotState:
    """A fresh decode state (a generate loop's start or restart): no slot holds a
    conversation's keys/values any more."""
    with self._conversation_lock:
      self._conversations.clear()
      self._slot_of.clear()
      self._store.clear()
      self._free_blocks = list(range(self._num_blocks))
    cfg, s = self.config, self._slots
    f32 = lambda *shape: jnp.zeros(shape, jnp.float32)
    state = SlotState(
        cache=llm.empty_cache(cfg, s, self.max_cache_length, self.model.dtype),
        logits=f32(s, cfg.vocab_size), pos=jnp.zeros((s,), jnp.int32),
        lengths=jnp.zeros((s,), jnp.int32), done=jnp.ones((s,), bool),
        temperature=jnp.ones((s,), jnp.float32), top_p=jnp.ones((s,), jnp.float32),
        top_k=jnp.zeros((s,), jnp.int32), keys=jnp.zeros((s, 2), jnp.uint32))
    return jax.device_put(state, self._replicated)

  @property
  def max_concurrent_decodes(self) -> int:
    return self._slots

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self._max_prefill

  @property
  def mesh(self) -> Mesh:
    return self._mesh

  @property
  def colocated_cpus(self):
    return None
