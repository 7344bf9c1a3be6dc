"""A Flax decoder for the Qwen2 / Llama family: policy (LM head) and critic (value head).

Layout choices:
- One `DecoderLayer` module with flat parameter names (`q_proj`, `gate_proj`, ...)
  scanned over a leading `layers` axis: params are `[L, ...]` arrays, which the
  pipeline-parallel code splits into stages and the partition rules address by name.
- Projection kernels keep heads as their own axis (`q_proj: [d, H, hd]`,
  `o_proj: [H, hd, d]`), so tensor parallelism can shard `H` without reshapes.
- Parameters are fp32 masters; `dtype` is the compute dtype. Norms, softmax and
  logits are computed in fp32.
- Attention takes an explicit boolean mask `[B, T, S]`; the same code serves
  training (causal + segment mask), prefill (prompt padded to a bucket) and decode
  (one token against a KV cache whose slot `i` holds position `i`).
  Long rows attend in query blocks (`attention`), so no `[T, S]` score matrix of a
  long row is ever materialised.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture hyper-parameters (what an HF `config.json` fixes)."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  qkv_bias: bool = False  # Qwen2: True
  o_bias: bool = False  # Llama attention_bias=True: q, k, v and o all biased
  max_position_embeddings: int = 4096
  initializer_range: float = 0.02
  architecture: str = "Qwen2ForCausalLM"  # the HF class to save as
  bos_token_id: Optional[int] = None
  eos_token_id: Optional[int] = None
  pad_token_id: Optional[int] = None
  # > 0: a sequence-classification checkpoint (`*ForSequenceClassification`): the trunk
  # of `architecture` with a `score` head of this many outputs, and no LM head
  num_labels: int = 0

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_attention_heads={self.num_heads} is not a multiple of "
                       f"num_key_value_heads={self.num_kv_heads}")

  @property
  def num_params(self) -> int:
    d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
    attn = d * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
    per_layer = attn + 3 * d * f + 2 * d
    head = (d * self.num_labels if self.num_labels else
            0 if self.tie_word_embeddings else d * self.vocab_size)
    return self.vocab_size * d + self.num_layers * per_layer + d + head


class KVCache(NamedTuple):
  """Keys/values of every layer: `[L, B, K, S, hd]`; index s holds position s.

  Heads before positions: the decode-time attention dot then contracts `hd` with
  (B, K) as batch dims and S as the free dim, with no transpose of the cache.
  """
  k: Array
  v: Array


def rope_cos_sin(positions_bt: Array, head_dim: int, theta: float) -> Tuple[Array, Array]:
  # HF's convention: frequencies for the first half repeated for the second half.
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs_bth = positions_bt.astype(jnp.float32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs_bth, freqs_bth], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_btnh: Array, cos_bth: Array, sin_bth: Array) -> Array:
  half = x_btnh.shape[-1] // 2
  rotated = jnp.concatenate([-x_btnh[..., half:], x_btnh[..., :half]], axis=-1)
  cos, sin = cos_bth[:, :, None, :], sin_bth[:, :, None, :]
  return (x_btnh.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x_btnh.dtype)


def rms_norm(x: Array, scale: Array, eps: float, dtype) -> Array:
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (scale * y).astype(dtype)


def dense(x: Array, w: Array, in_dims: int = 1) -> Array:
  """Contracts the last `in_dims` axes of `x` with the first `in_dims` axes of `w`.

  Written as one 2-D matmul over flattened tokens: `[B*T, in] @ [in, out]`. As a
  3-D einsum ("btd,df->btf") XLA:CPU lays the weight gradient's operands out
  transposed and copies them every layer (the policy's gradient step, 64 x 160
  tokens on a 2-core CPU: 929 -> 761 ms; bench/model.py).
  """
  lead, in_shape = x.shape[:x.ndim - in_dims], w.shape[:in_dims]
  out_shape = w.shape[in_dims:]
  k = math.prod(in_shape)
  y = jnp.dot(x.reshape(-1, k), w.reshape(k, -1))
  return y.reshape(*lead, *out_shape)


def causal_segment_mask(segment_ids_bt: Array) -> Array:
  """[B, T, T] mask: causal, within one segment, never onto padding (segment 0)."""
  t = segment_ids_bt.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  same = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
  return causal[None] & same & (segment_ids_bt[:, None, :] != 0)


def positions_from_segments(segment_ids_bt: Array) -> Array:
  """Position ids restarting at 0 in each segment (packed rows)."""
  def row(seg):
    idx = jnp.arange(seg.shape[0])
    starts = jnp.concatenate([jnp.array([True]), seg[1:] != seg[:-1]])
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=0)
    return idx - start_idx
  return jax.vmap(row)(segment_ids_bt)


# Query rows per attention block. Rows longer than this attend block by block, so
# the fp32 scores of a call are [B, H, block, S] instead of [B, H, T, S]: a JetStream
# prefill of 8 rows x 4096 tokens of the default 0.67M-parameter model needs 6.3 GB of
# XLA temp buffers with one dense softmax, 1.1 GB in blocks of 512 (bench/attention.py).
# Up to the block, one dense softmax: faster for short rows (every shipped CPU config
# trains on rows of <= 512 tokens).
ATTENTION_BLOCK = 512


def _dense_attention(q_btkgh: Array, k_bskh: Array, v_bskh: Array, mask_bts: Array) -> Array:
  scale = 1.0 / jnp.sqrt(jnp.float32(q_btkgh.shape[-1]))
  scores = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_bskh,
                      preferred_element_type=jnp.float32) * scale
  scores = jnp.where(mask_bts[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q_btkgh.dtype)
  return jnp.einsum("bkgts,bskh->btkgh", probs, v_bskh)


def attention(q_btkgh: Array, k_bskh: Array, v_bskh: Array, mask_bts: Array,
              block: int = ATTENTION_BLOCK) -> Array:
  """Grouped-query attention of T queries over S keys under a boolean mask.

  Each query row's softmax is its own, so splitting the queries into blocks changes
  nothing but the peak memory. The blocks run in a `lax.map` (one block's scores
  live at a time), each under `jax.checkpoint`: the backward pass recomputes a
  block's probabilities instead of keeping all T x S of them for the gradient.
  A ragged last block is padded with masked-out query rows and cut off again.
  """
  b, t = q_btkgh.shape[:2]
  if block <= 0 or t <= block:
    return _dense_attention(q_btkgh, k_bskh, v_bskh, mask_bts)
  nb = -(-t // block)
  pad = nb * block - t
  q = jnp.pad(q_btkgh, [(0, 0), (0, pad)] + [(0, 0)] * 3)
  mask = jnp.pad(mask_bts, [(0, 0), (0, pad), (0, 0)])
  q_nbqkgh = q.reshape(b, nb, block, *q.shape[2:]).swapaxes(0, 1)
  mask_nbqs = mask.reshape(b, nb, block, mask.shape[-1]).swapaxes(0, 1)
  one_block = jax.checkpoint(lambda qm: _dense_attention(qm[0], k_bskh, v_bskh, qm[1]))
  out = jax.lax.map(one_block, (q_nbqkgh, mask_nbqs))  # [nb, B, block, K, G, hd]
  return out.swapaxes(0, 1).reshape(b, nb * block, *out.shape[3:])[:, :t]


class DecoderLayer(nn.Module):
  config: ModelConfig
  dtype: Any = jnp.float32
  attention_block: int = ATTENTION_BLOCK
  lora_scale: Optional[float] = None  # the adapters' scale (rollx.models.lora), if any

  def _proj(self, name: str, h: Array, w: Array, in_dims: int = 1) -> Array:
    """h through kernel `name`, plus its low-rank adapter where the params hold one
    (`{name}_lora_a` / `_lora_b`): scale * (h A) B, never A B materialised."""
    y = dense(h, w, in_dims)
    if not self.has_variable("params", name + "_lora_a"):
      return y
    if self.lora_scale is None:
      raise ValueError(f"params hold {name}'s LoRA adapter, but the model has no lora_scale")
    a = self.get_variable("params", name + "_lora_a").astype(self.dtype)
    b = self.get_variable("params", name + "_lora_b").astype(self.dtype)
    return y + (dense(dense(h, a, in_dims), b) * self.lora_scale).astype(y.dtype)

  @nn.compact
  def __call__(self, x_btd, cos_bth, sin_bth, mask_bts, cache, cache_index_b):
    cfg, dt = self.config, self.dtype
    d, n, k, hd, f = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.intermediate_size)
    init = nn.initializers.normal(cfg.initializer_range)
    zeros, ones = nn.initializers.zeros, nn.initializers.ones
    p = lambda name, shape, i=init: self.param(name, i, shape, jnp.float32).astype(dt)
    proj = lambda name, x, shape, in_dims=1: self._proj(name, x, p(name, shape), in_dims)

    h = rms_norm(x_btd, self.param("input_layernorm", ones, (d,), jnp.float32),
                 cfg.rms_norm_eps, dt)
    q = proj("q_proj", h, (d, n, hd))
    kk = proj("k_proj", h, (d, k, hd))
    v = proj("v_proj", h, (d, k, hd))
    if cfg.qkv_bias:
      q = q + p("q_bias", (n, hd), zeros)
      kk = kk + p("k_bias", (k, hd), zeros)
      v = v + p("v_bias", (k, hd), zeros)
    q, kk = apply_rope(q, cos_bth, sin_bth), apply_rope(kk, cos_bth, sin_bth)

    b, t = q.shape[:2]
    q = q.reshape(b, t, k, n // k, hd)  # grouped-query attention: G query heads per kv head
    if cache is None:  # training / prefill: attend over this call's own keys
      attn = attention(q, kk, v, mask_bts, self.attention_block)
    elif t > 1:  # extend (`extend`): the cached prefix's keys, then this call's own
      keys = jnp.concatenate([cache[0].swapaxes(1, 2).astype(dt), kk], axis=1)
      values = jnp.concatenate([cache[1].swapaxes(1, 2).astype(dt), v], axis=1)
      attn = attention(q, keys, values, mask_bts, self.attention_block)
    else:
      scale = 1.0 / jnp.sqrt(jnp.float32(hd))
      neg = jnp.finfo(jnp.float32).min
      # decode (t = 1): the cache is only read here (mask: its first `pos` slots),
      # the new token attends to itself through a second softmax term, and its
      # k/v go back to the caller, which writes them into the (donated) cache in
      # one scatter. Returning a rewritten cache from every layer would copy the
      # whole cache each step.
      ck, cv = cache[0].astype(dt), cache[1].astype(dt)
      # t = 1: a multiply-reduce over hd reads each cache row once (memory bound, as
      # decode is); as a batched matmul of [G, hd] x [hd, S] XLA:CPU ran 8x slower.
      q1 = q[:, 0].astype(jnp.float32)  # [B, K, G, hd]
      s_cache = jnp.sum(q1[:, :, :, None, :] * ck[:, :, None].astype(jnp.float32),
                        axis=-1)[:, :, :, None, :] * scale  # [B, K, G, 1, S]
      s_cache = jnp.where(mask_bts[:, None, None], s_cache, neg)
      s_self = jnp.einsum("btkgh,btkh->bkgt", q, kk, preferred_element_type=jnp.float32)[..., None] * scale
      top = jnp.maximum(jnp.max(s_cache, axis=-1, keepdims=True), s_self)
      p_cache, p_self = jnp.exp(s_cache - top), jnp.exp(s_self - top)
      denom = jnp.sum(p_cache, axis=-1, keepdims=True) + p_self
      w = (p_cache / denom)[:, :, :, 0]  # [B, K, G, S]
      mixed = jnp.sum(w[..., None] * cv[:, :, None].astype(jnp.float32),
                      axis=3)[:, None].astype(dt)  # [B, 1, K, G, hd]
      attn = mixed + jnp.einsum("bkgts,btkh->btkgh", (p_self / denom).astype(dt), v)
    attn = attn.reshape(b, t, n, hd)
    new_cache = (kk.swapaxes(1, 2), v.swapaxes(1, 2))  # [B, K, T, hd]
    out = proj("o_proj", attn, (n, hd, d), in_dims=2)
    if cfg.o_bias:
      out = out + p("o_bias", (d,), zeros)
    x_btd = x_btd + out

    h = rms_norm(x_btd, self.param("post_attention_layernorm", ones, (d,), jnp.float32),
                 cfg.rms_norm_eps, dt)
    gate = proj("gate_proj", h, (d, f))
    up = proj("up_proj", h, (d, f))
    x_btd = x_btd + proj("down_proj", jax.nn.silu(gate) * up, (f, d))
    return x_btd, new_cache


def run_layers(config: ModelConfig, dtype, remat: bool, layer_params, x_btd, cos_bth, sin_bth,
               mask_bts, attention_block: int = ATTENTION_BLOCK,
               lora_scale: Optional[float] = None):
  """The layer stack as a plain scan over `layer_params` ([L', ...] leaves).

  The same math as the scanned module inside `Transformer`; the pipeline runs one
  stage's slice of layers with it.
  """
  layer = DecoderLayer(config, dtype, attention_block, lora_scale)

  def body(x, p):
    return layer.apply({"params": p}, x, cos_bth, sin_bth, mask_bts, None, None)[0], None

  if remat:
    body = jax.checkpoint(body, prevent_cse=False, policy=jax.checkpoint_policies.nothing_saveable)
  return jax.lax.scan(body, x_btd, layer_params)[0]


class Transformer(nn.Module):
  """Decoder trunk + head. `head='lm'` gives logits `[B,T,V]`, `'value'` values `[B,T]`,
  `'score'` a sequence-classification head's outputs `[B,T,num_labels]`.

  `layers_fn(layer_params, x, cos, sin, mask) -> x`, when set, replaces the scanned
  layer stack in training forwards (the pipeline schedule plugs in here);
  `activation_constraint(x_btd) -> x_btd` pins the residual stream's sharding.
  `gather_bk`, when given, applies the head at those K positions of each row only
  (`[B,K,V]` logits): a trainer scores the response tokens, a few of each row.
  """
  config: ModelConfig
  dtype: Any = jnp.float32
  remat: bool = False
  head: str = "lm"
  layers_fn: Optional[Callable] = None
  activation_constraint: Optional[Callable] = None
  attention_block: int = ATTENTION_BLOCK  # query rows per block (`attention`): memory only
  # LoRA's scale: the layers apply the adapters the params hold (rollx.models.lora)
  lora_scale: Optional[float] = None

  @nn.compact
  def __call__(self, tokens_bt: Array, positions_bt: Array, mask_bts: Array,
               cache: Optional[KVCache] = None, cache_index_b: Optional[Array] = None,
               gather_bk: Optional[Array] = None):
    cfg = self.config
    constrain = self.activation_constraint or (lambda x: x)
    embed = self.param("embed_tokens", nn.initializers.normal(cfg.initializer_range),
                       (cfg.vocab_size, cfg.hidden_size), jnp.float32)
    x = constrain(jnp.take(embed, tokens_bt, axis=0).astype(self.dtype))
    cos, sin = rope_cos_sin(positions_bt, cfg.head_dim, cfg.rope_theta)

    layer_cls = DecoderLayer
    if self.remat:
      layer_cls = nn.remat(DecoderLayer, prevent_cse=False,
                           policy=jax.checkpoint_policies.nothing_saveable)
    layers = nn.scan(
        layer_cls, variable_axes={"params": 0}, split_rngs={"params": True},
        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0, nn.broadcast),
        length=cfg.num_layers, metadata_params={nn.PARTITION_NAME: "layers"},
    )(cfg, self.dtype, self.attention_block, self.lora_scale, name="layers")
    if self.layers_fn is not None and cache is None and not self.is_initializing():
      x = self.layers_fn(self.variables["params"]["layers"], x, cos, sin, mask_bts)
      new_cache = (None, None)
    else:
      decoding = cache is not None and tokens_bt.shape[1] == 1
      layer_cache = None if cache is None else (cache.k, cache.v)
      if decoding:
        # decode reads the cache only up to the mask's width (`decode_step`'s `read_len`):
        # the positions any row attends to, not the whole allocation
        read = mask_bts.shape[-1]
        layer_cache = (cache.k[:, :, :, :read], cache.v[:, :, :, :read])
      x, new_cache = layers(x, cos, sin, mask_bts, layer_cache, cache_index_b)
      if decoding:  # write each row's new k/v
        rows = jnp.arange(tokens_bt.shape[0])
        # full: [L, B, K, S, hd]; new: [L, B, K, 1, hd]. Advanced indices on B and S
        # (split by a slice) put the indexed dims first: values are [B, L, K, hd].
        new_cache = tuple(
            full.at[:, rows, :, cache_index_b].set(
                new[:, :, :, 0].swapaxes(0, 1).astype(full.dtype))
            for full, new in zip((cache.k, cache.v), new_cache))
    x = constrain(x)
    x = rms_norm(x, self.param("norm", nn.initializers.ones, (cfg.hidden_size,), jnp.float32),
                 cfg.rms_norm_eps, self.dtype)
    if gather_bk is not None:
      x = jnp.take_along_axis(x, gather_bk[:, :, None], axis=1)

    if self.head == "value":
      w = self.param("value_head", nn.initializers.zeros, (cfg.hidden_size,), jnp.float32)
      b = self.param("value_bias", nn.initializers.zeros, (), jnp.float32)
      out = jnp.einsum("btd,d->bt", x.astype(jnp.float32), w) + b
    elif self.head == "score":
      w = self.param("score_head", nn.initializers.normal(cfg.initializer_range),
                     (cfg.hidden_size, cfg.num_labels), jnp.float32)
      out = jnp.einsum("btd,dl->btl", x.astype(jnp.float32), w)
    elif cfg.tie_word_embeddings:
      out = jnp.einsum("btd,vd->btv", x, embed.astype(self.dtype),
                       preferred_element_type=jnp.float32)
    else:
      w = self.param("lm_head", nn.initializers.normal(cfg.initializer_range),
                     (cfg.hidden_size, cfg.vocab_size), jnp.float32)
      out = jnp.einsum("btd,dv->btv", x, w.astype(self.dtype),
                       preferred_element_type=jnp.float32)
    return out, KVCache(*new_cache)


def make_model(config: ModelConfig, dtype: str = "fp32", remat: bool = False,
               head: str = "lm", **hooks) -> Transformer:
  if dtype not in DTYPES:
    raise ValueError(f"model_args.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
  return Transformer(config, DTYPES[dtype], remat, head, **hooks)


def init_params(model: Transformer, rng: Array):
  tokens = jnp.zeros((1, 1), jnp.int32)
  return model.init(rng, tokens, tokens, jnp.ones((1, 1, 1), bool))["params"]


# -- forward passes ------------------------------------------------------------


def forward(model: Transformer, params, tokens_bt: Array,
            segment_ids_bt: Optional[Array] = None, positions_bt: Optional[Array] = None,
            gather_bk: Optional[Array] = None) -> Array:
  """Logits (or values) of a packed batch. `segment_ids` 0 = padding; with `gather_bk`,
  only at those positions of each row ([B,K,...])."""
  if segment_ids_bt is None:
    segment_ids_bt = jnp.ones_like(tokens_bt)
  if positions_bt is None:
    positions_bt = positions_from_segments(segment_ids_bt)
  out, _ = model.apply({"params": params}, tokens_bt, positions_bt,
                       causal_segment_mask(segment_ids_bt), gather_bk=gather_bk)
  return out


def prefill(model: Transformer, params, tokens_bt: Array, true_length_b: Array):
  """Runs right-padded prompts; returns (logits at each row's last real token, KV cache)."""
  t = tokens_bt.shape[1]
  positions = jnp.broadcast_to(jnp.arange(t), tokens_bt.shape)
  key_ok = jnp.arange(t)[None, :] < true_length_b[:, None]
  mask = jnp.tril(jnp.ones((t, t), bool))[None] & key_ok[:, None, :]
  # The head runs at the last real token only: [B, V], not [B, T, V] logits.
  last, cache = model.apply({"params": params}, tokens_bt, positions, mask,
                            gather_bk=(true_length_b - 1)[:, None])
  return last[:, 0], cache


def extend(model: Transformer, params, tokens_bt: Array, start_b: Array, length_b: Array,
           cache: KVCache):
  """Prefills new tokens onto cached prefixes (KV reuse across the turns of a
  conversation): row b's `length_b` tokens (right-padded to T) sit at positions
  start_b, start_b + 1, ... and attend to the row's first `start_b` cached positions
  of `cache` [L,B,K,S,hd] and causally to each other. Returns (logits at each row's
  last new token [B,V], the new tokens' keys/values [L,B,K,T,hd], for the caller to
  write at start_b)."""
  b, t = tokens_bt.shape
  s = cache.k.shape[3]
  positions = start_b[:, None] + jnp.arange(t)[None, :]
  cached = jnp.broadcast_to((jnp.arange(s)[None, None, :] < start_b[:, None, None]), (b, t, s))
  own = jnp.tril(jnp.ones((t, t), bool))[None] & (jnp.arange(t)[None, None, :]
                                                   < length_b[:, None, None])
  last, new = model.apply({"params": params}, tokens_bt, positions,
                          jnp.concatenate([cached, own], axis=-1), cache,
                          gather_bk=(length_b - 1)[:, None])
  return last[:, 0], new


def decode_step(model: Transformer, params, tokens_b: Array, positions_b: Array,
                cache: KVCache, read_len: Optional[int] = None):
  """One token per row at `positions_b` against `cache` [L,B,K,S,hd]; returns (logits_bv, cache)
  with the token's keys/values written at `positions_b`.

  `read_len` (static, <= S): attention reads only cache positions [0, read_len), so a
  step costs the conversations' length, not the allocation's. Rows whose position
  exceeds it get wrong logits (a caller passes the largest live row's position or more);
  every row's keys/values are still written at its position."""
  s = cache.k.shape[3] if read_len is None else min(int(read_len), cache.k.shape[3])
  mask = (jnp.arange(s)[None, :] < positions_b[:, None])[:, None, :]  # earlier tokens only
  logits, cache = model.apply({"params": params}, tokens_b[:, None], positions_b[:, None], mask,
                              cache, positions_b)
  return logits[:, 0], cache


def empty_cache(config: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
  shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
  return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def pad_cache(cache: KVCache, max_len: int) -> KVCache:
  """Grows a prefill cache [L,B,K,T,hd] to [L,B,K,max_len,hd] (zeros after T)."""
  pad = [(0, 0), (0, 0), (0, 0), (0, max_len - cache.k.shape[3]), (0, 0)]
  return KVCache(jnp.pad(cache.k, pad), jnp.pad(cache.v, pad))


def generate(model: Transformer, params, prompt_ids, max_new_tokens: int,
             eos_token_id: Optional[int] = None, temperature: float = 0.0,
             rng: Optional[Array] = None) -> list:
  """Decodes one prompt with the KV cache (tests, `rollx.play`): greedy at
  temperature 0, else sampled. Stops after EOS (included) or `max_new_tokens`."""
  prompt = jnp.asarray(prompt_ids, jnp.int32)[None]
  n = prompt.shape[1]
  logits, cache = jax.jit(prefill, static_argnums=0)(model, params, prompt, jnp.array([n]))
  cache = pad_cache(cache, n + max_new_tokens)
  step = jax.jit(decode_step, static_argnums=0)
  rng = jax.random.PRNGKey(0) if rng is None else rng

  def pick(logits, key):
    if temperature <= 0:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)

  out = []
  for i in range(max_new_tokens):
    rng, key = jax.random.split(rng)
    token = pick(logits, key)
    out.append(int(token[0]))
    if (eos_token_id is not None and out[-1] == eos_token_id) or i + 1 == max_new_tokens:
      break
    logits, cache = step(model, params, token, jnp.array([n + i]), cache)
  return out


def greedy_generate(model: Transformer, params, prompt_ids, max_new_tokens: int,
                    eos_token_id: Optional[int] = None) -> list:
  return generate(model, params, prompt_ids, max_new_tokens, eos_token_id)
