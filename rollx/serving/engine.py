"""A google-jetstream `Engine` for rollx models: JetStream's Engine API (prefill, insert,
generate) over the slot operations of `rollx.serving.slot_ops`, with the host-side
bookkeeping around them: prompts staged for the next generate step, conversations whose
keys/values a later turn reuses (in the slots and in `rollx.serving.prefix_store`), and
the weights version of every step (`rollx.serving.versions`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import threading
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rollx.models import llm, lora
from rollx.parallel import partition
from rollx.parallel.mesh import MESH_AXES
from rollx.serving import compat

compat.apply()
from jetstream.engine import engine_api, tokenizer_pb2  # noqa: E402

from rollx.serving import PREFILL_BUCKETS, slot_ops  # noqa: E402
from rollx.serving.prefill_rows import PrefillRows  # noqa: E402
from rollx.serving.prefix_store import PREFIX_BLOCK, PrefixStore  # noqa: E402
from rollx.serving.read_lengths import ReadLengths  # noqa: E402
from rollx.serving.slot_ops import SlotState  # noqa: E402
from rollx.serving.tokenizer import TokenIdsTokenizer  # noqa: E402
from rollx.serving.versions import StepVersions, VersionedParams  # noqa: E402


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


class RollxEngine(engine_api.Engine):
  """JetStream's Engine API over `max_concurrent_decodes` slots (`slot_ops.SlotState`).

  - `prefill` stages one prompt (padded to a power-of-two bucket) without a model call: as
    in JetStream 0.2.2's API, prefill emits no token; the first comes from the next
    `generate`.
  - `insert` gives a staged prompt a slot, its sampling settings (train and validation
    requests share the batch) and its sampling key (from the request's id: token i is drawn
    with fold_in(key, i), so a request's tokens do not depend on the batch it shares or on
    when it arrived); host-side bookkeeping only.
  - `generate` prefills every prompt inserted since the last step, in calls of at most
    `prefill_batch` rows, then samples one token for every slot and runs one decode step. A
    sampled stop id is returned as a normal token (trajectories contain exactly what the
    model produced, EOS included); the slot reports `valid = 0` from the next step on
    (rollx.serving.batching ends the request at the stop id itself).

  Prefill is deferred into `generate` so that a step's newcomers share as few calls as their
  buckets allow (JetStream 0.2.2's orchestrator prefills one request per call on its own
  thread; with short multi-turn prompts that chain, not the model, set the rate).

  KV reuse across turns (`reuse_kv`): an agent's every turn sends the whole conversation so
  far. When a request names its trajectory (`trajectory_id`) and its ids start with the
  previous turn's prompt and response (checked id by id), only the new ids are prefilled
  (`llm.extend`) onto the keys/values that turn left. Exact: they must come from the
  weights that will sample, so a weight update since, or the slot given to another
  request, means a full prefill. With `keep_prefix_across_updates` a weight update keeps
  them: each cached id is tagged with the version that computed it, the request's prefill
  version is the oldest of them (so the trainer's off-policy correction sees the
  staleness), counted in `stale_reused_tokens` and `max_prefix_staleness`. A finished
  conversation stays in its slot (the generate loop gives its next turn that slot when free,
  else the slot freed longest ago) until the slot goes to another request, then moves to
  the prefix store (`prefix_cache_tokens`; 0 = none): a server keeps more conversations than
  it has slots, and the slots (whose count sets the cost of every decode step) can be sized
  for the requests in flight alone. A trajectory that ended (`end_trajectory`) is dropped
  from both.

  Weights: `update_params` swaps the `VersionedParams` contents and every generate step
  reads (version, params) once, so a swap lands between two steps, never inside one. Each
  step's output also carries every sampled token's behaviour log-prob (`slot_ops.sample_tokens`).
  """

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
    self._mesh = mesh or Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1, 1), MESH_AXES)
    self._base = self._place(params)  # what adapters (lora.AdapterWeights) fold into
    self.params_holder = VersionedParams(self._base, version)
    self._merge = jax.jit(lora.merge, static_argnums=2,
                          out_shardings=partition.param_shardings(self._base, self._mesh))
    self._slots = int(max_concurrent_decodes)
    self._prefill_batch = max(1, min(int(prefill_batch), self._slots))
    self._max_prefill = int(max_prefill_length)
    self.max_cache_length = int(max_cache_length)
    self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
    self.sampling = dict(sampling or {"train": Sampling(), "val": Sampling(temperature=0.0)})
    self._hf_tokenizer, self._pad_id = hf_tokenizer, int(pad_id)
    # decode and extend read the cache up to the live length (`rollx.serving.read_lengths`)
    self.read_lengths = ReadLengths(self._slots, self.max_cache_length)
    self._rows = PrefillRows(self._slots, self._prefill_batch, self.max_cache_length,
                             self._pad_id)
    self._base_key = jax.random.PRNGKey(seed)
    self._anonymous_requests = 0
    self._steps = StepVersions()
    # KV reuse across turns: slot -> the conversation whose keys/values it holds, and
    # trajectory -> its slot
    self.reuse_kv = bool(reuse_kv)
    self.keep_prefix_across_updates = bool(keep_prefix_across_updates)
    self.stale_reused_tokens = 0  # reused ids computed by older weights than the sampling's
    self.max_prefix_staleness = 0  # the largest version gap of a reused id
    self._conversations: Dict[int, _Conversation] = {}
    self._slot_of: Dict[str, int] = {}
    self._conversation_lock = threading.Lock()
    self._store = PrefixStore(int(prefix_cache_tokens) if self.reuse_kv else 0,
                              self.max_cache_length)
    self.store_reused_tokens = 0  # reused ids copied back from the store
    self.prefilled_tokens = 0  # prompt tokens run through the model
    self.reused_tokens = 0  # prompt tokens whose keys/values were reused instead
    stop = jnp.asarray(self.stop_token_ids or (-1,), jnp.int32)

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
    # (donate_argnums count the call's arguments, after those `partial` binds)
    jit = lambda fn, donate, static=(): jax.jit(fn, donate_argnums=donate, static_argnames=static,
                                                out_shardings=self._replicated)
    self._prefill = jit(functools.partial(slot_ops.prefill_into_slots, model, self._base_key), 1)
    self._extend = jit(functools.partial(slot_ops.extend_into_slots, model, self._base_key), 1,
                       "read_len")
    self._move = jit(slot_ops.move_slot, 0)
    self._generate = jit(functools.partial(slot_ops.decode_slots, model, stop), 1, "read_len")
    self._store_slot = jit(slot_ops.store_slot, 1)
    self._load_slot = jit(slot_ops.load_slot, 0)
    self._pool = None
    if self._store.num_blocks:
      shape = (self.config.num_layers, self._store.num_blocks, self.config.num_kv_heads,
               PREFIX_BLOCK, self.config.head_dim)
      zeros = lambda: jnp.zeros(shape, self.model.dtype)
      self._pool = jax.device_put(llm.KVCache(zeros(), zeros()), self._replicated)

  # -- weights ---------------------------------------------------------------
  def _place(self, params):
    return jax.device_put(params, partition.param_shardings(params, self._mesh))

  def update_params(self, params, version: int) -> None:
    """Swap in new weights; the next prefill / generate step uses them. `params` is a
    whole params tree (the new base), or `lora.AdapterWeights`: adapters folded into the
    base on device (merged once per sync, so a decode step costs what the base's does)."""
    if isinstance(params, lora.AdapterWeights):
      weights = self._merge(self._base, self._place(params.tensors), params.scale)
    else:
      weights = self._base = self._place(params)
    self.params_holder.set(weights, version)

  @property
  def num_steps(self) -> int:
    """Generate steps run so far."""
    return self._steps.num_steps

  def version_at(self, step: int) -> int:
    return self._steps.at(step)

  def versions_of(self, first_step: Optional[int], num_tokens: int) -> List[int]:
    """Policy version of each of a request's tokens (`StepVersions.of_tokens`)."""
    return self._steps.of_tokens(first_step, num_tokens)

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
    self.read_lengths.insert(int(slot), prefix.true_length)
    staged, source, evicted, stored = self._continuation(int(slot), prefix, sampling)
    if evicted is not None:  # the slot's previous conversation into the store first
      self._pool = self._store_slot(decode_state.cache, self._pool, np.int32(slot),
                                    self._store.block_array(evicted.blocks))
    if stored is not None:  # this conversation back from the store
      decode_state = self._load_slot(decode_state, self._pool, np.int32(slot),
                                     self._store.block_array(stored.blocks))
      staged.from_store = True
      with self._conversation_lock:  # (dispatched: a later store into them runs after)
        self._store.release(stored.blocks)
    elif staged.start and source != slot:
      # moved now, before anything is prefilled into `source` (the generate loop may
      # give it to another request of this very step)
      decode_state = self._move(decode_state, np.int32(source), np.int32(slot))
    self._staged.append(staged)
    return decode_state

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
      entry = self._store.pop(trajectory) if trajectory and previous is None else None
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
        self._store.release(entry.blocks)
      dropped = self._conversations.pop(slot, None)
      if dropped is not None and self._slot_of.get(dropped.trajectory_id) == slot:
        del self._slot_of[dropped.trajectory_id]
        if dropped.finished and dropped.trajectory_id != trajectory:
          evicted = self._store.keep(dropped)
      if trajectory:
        since = candidate.since if staged.start else self.num_steps
        staged.conversation = self._conversations[slot] = _Conversation(
            trajectory, ids, since, prefix.request)
        self._slot_of[trajectory] = slot
    return staged, source, evicted, stored

  def end_trajectory(self, trajectory: str) -> Optional[int]:
    """`trajectory` ended: its keys/values are dropped from its slot or the store. Returns
    the slot that held them (now the best one to give away), or None."""
    with self._conversation_lock:
      entry = self._store.pop(trajectory)
      if entry is not None:
        self._store.release(entry.blocks)
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
      return self._store.tokens

  @property
  def store_evictions(self) -> int:
    """Conversations evicted from the prefix store for room."""
    return self._store.evictions

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
              self._steps.of_keys_values(getattr(request, "first_step", None),
                                        len(response_ids))])
        conversation.finished = True

  def release_slot(self, slot: int) -> None:
    """`slot`'s request ended (finished, aborted or cancelled): decode steps no longer
    need to read its keys/values. (A caller that never releases only makes every step
    read more.)"""
    self.read_lengths.release(slot)

  def warmup(self, prompt_buckets: Sequence[int]) -> None:
    """Compiles the decode step (at the read lengths these prompts start in; longer ones
    compile when a conversation first reaches them) and the prefill for these prompt
    buckets (prompts are padded to `PREFILL_BUCKETS`), on a scratch decode state."""
    weights = self.params_holder.get()[1]
    state = self.init_decode_state()
    for read_len in self.read_lengths.up_to(max(prompt_buckets, default=0)):
      state, _, totals = self._generate(weights, state, self._logp_totals, read_len=read_len)
    for width in prompt_buckets:  # every row is padding (slot out of range): state unchanged
      state = self._prefill(weights, state, *self._rows.prefill(width, ()))
      if self.reuse_kv:  # a continuation's new ids take the same buckets
        state = self._extend(weights, state, *self._rows.extend(width, ()),
                             read_len=self.read_lengths.buckets[0])
    if self.reuse_kv:
      state = self._move(state, np.int32(0), np.int32(0))
    if self._pool is not None:  # all-padding blocks: the store is unchanged
      blocks = self._store.block_array(())
      self._pool = self._store_slot(state.cache, self._pool, np.int32(0), blocks)
      state = self._load_slot(state, self._pool, np.int32(0), blocks)
    jax.block_until_ready((state, totals))

  def generate(self, params: VersionedParams, decode_state: SlotState):
    version, weights = params.get()
    staged, self._staged = self._staged, []
    stale_since: Dict[int, int] = {}  # staged index -> the oldest version it reuses
    for i, s in enumerate(staged):
      if s.start and not self._steps.unchanged_since(s.conversation.since, version):
        cached = s.cached_versions
        if self.keep_prefix_across_updates and cached is not None and len(cached) >= s.start:
          oldest = int(cached[:s.start].min())
          stale_since[i] = oldest
          self.stale_reused_tokens += int(np.sum(cached[:s.start] != version))
          self.max_prefix_staleness = max(self.max_prefix_staleness, version - oldest)
        else:  # the weights changed since the prefix was computed: prefill it all again
          s.start, s.conversation.since = 0, self.num_steps
    # Same-bucket prompts share a call (each is padded to its bucket).
    for width, chunk in self._rows.chunks([s for s in staged if not s.start],
                                          lambda s: len(s.prefix.tokens)):
      decode_state = self._prefill(weights, decode_state, *self._rows.prefill(width, chunk))
    new_ids = lambda s: prefill_bucket(s.prefix.true_length - s.start)
    for width, chunk in self._rows.chunks([s for s in staged if s.start], new_ids, True):
      read_len = self.read_lengths.bucket(max(s.start for s in chunk))  # the cached ids they attend to
      decode_state = self._extend(weights, decode_state, *self._rows.extend(width, chunk),
                                  read_len=read_len)
    self.prefilled_tokens += sum(s.prefix.true_length - s.start for s in staged)
    self.reused_tokens += sum(s.start for s in staged)
    self.store_reused_tokens += sum(s.start for s in staged if s.from_store)
    # the running totals go through the jitted step: an eager add here cost ~1 ms a step
    decode_state, data, self._logp_totals = self._generate(
        weights, decode_state, self._logp_totals, read_len=self.read_lengths.decode)
    self.read_lengths.step()
    for i, s in enumerate(staged):  # the weights that prefilled it, not those at staging
      if s.prefix.request is not None:  # (kept stale keys/values: the oldest among them)
        s.prefix.request.prefill_version = min(version, stale_since.get(i, version))
      if s.conversation is not None and self.keep_prefix_across_updates:
        reused = (s.cached_versions[:s.start] if s.start and s.cached_versions is not None
                  else np.zeros((0,), np.int32))
        s.conversation.versions = np.concatenate([
            reused.astype(np.int32), np.full(len(s.conversation.ids) - len(reused), version,
                                             np.int32)])
    self._steps.record(version)
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
    self.read_lengths.reset()
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
