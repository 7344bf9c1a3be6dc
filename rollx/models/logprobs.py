"""Per-token log-probs and entropies of a packed batch, shared by actor and reference;
the critic's values with the same alignment (`compute_values`).

Alignment: `logp_bt[:, t] = log p(input_ids[:, t] | input_ids[:, :t])`, i.e. each
value sits on the token it scores, so `response_mask_bt` (1 on generated tokens)
selects exactly the generated tokens' log-probs. Position 0 and the first token of
each packed segment have no prediction and get 0.

`score_bk` (rollx.trainer.packing.score_positions) names the positions a caller reads
(the response tokens); the LM head, log-softmax and entropy then run there only and
every other position gets 0. A FrozenLake step sample is ~27 prompt tokens and 4
response tokens, so the head ran ~7x more often than needed; with a real vocabulary
(150k) the full [B,T,V] logits are also most of the step's activation memory.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from rollx.models import llm


def _target_logp_and_entropy(logits_xv: jax.Array, targets_x: jax.Array, temperature: float = 1.0):
  """log p(target) and the entropy of each row of softmax(logits / temperature); fp32."""
  logits_xv = logits_xv.astype(jnp.float32)
  if temperature != 1.0:
    logits_xv = logits_xv / temperature
  logp_xv = jax.nn.log_softmax(logits_xv, axis=-1)
  logp_x = jnp.take_along_axis(logp_xv, targets_x[..., None], axis=-1)[..., 0]
  return logp_x, -jnp.sum(jnp.exp(logp_xv) * logp_xv, axis=-1)


def logprobs_from_logits(logits_btv: jax.Array, input_ids_bt: jax.Array,
                         temperature: float = 1.0) -> Tuple[jax.Array, jax.Array]:
  """(logp_bt, entropy_bt) aligned to the scored token; fp32."""
  logp, entropy = _target_logp_and_entropy(logits_btv[:, :-1], input_ids_bt[:, 1:], temperature)
  pad = ((0, 0), (1, 0))
  return jnp.pad(logp, pad), jnp.pad(entropy, pad)


def _scored_logprobs(model, params, input_ids_bt, segment_ids_bt, score_bk, temperature):
  """logprobs_from_logits at the positions `score_bk` only (padding entries = T)."""
  b, t = input_ids_bt.shape
  # the logits at position p - 1 predict the token at p
  logits_bkv = llm.forward(model, params, input_ids_bt, segment_ids_bt,
                           gather_bk=jnp.clip(score_bk - 1, 0, t - 1))
  targets_bk = jnp.take_along_axis(input_ids_bt, jnp.minimum(score_bk, t - 1), axis=1)
  logp_bk, entropy_bk = _target_logp_and_entropy(logits_bkv, targets_bk, temperature)
  rows = jnp.arange(b)[:, None]
  scatter = lambda v_bk: jnp.zeros((b, t), jnp.float32).at[rows, score_bk].set(v_bk, mode="drop")
  return scatter(logp_bk), scatter(entropy_bk)


def compute_logprobs(model: llm.Transformer, params, input_ids_bt: jax.Array,
                     segment_ids_bt: Optional[jax.Array] = None,
                     score_bk: Optional[jax.Array] = None, temperature: float = 1.0
                     ) -> Tuple[jax.Array, jax.Array]:
  """Log-probs and entropies of `input_ids` under `params`; segment 0 = padding.
  With `score_bk`, only at those positions (0 elsewhere). `temperature`: of the
  distribution the rollout sampled from, softmax(logits / temperature), over the whole
  vocabulary (the servers' top-k / top-p truncation is not applied here: see
  rollx.serving.slot_ops.sample_tokens)."""
  if segment_ids_bt is None:
    segment_ids_bt = jnp.ones_like(input_ids_bt)
  if score_bk is None:
    logits = llm.forward(model, params, input_ids_bt, segment_ids_bt)
    logp, entropy = logprobs_from_logits(logits, input_ids_bt, temperature)
  else:
    logp, entropy = _scored_logprobs(model, params, input_ids_bt, segment_ids_bt, score_bk,
                                     temperature)
  # A token opening a segment is not predicted by the previous segment's last token.
  same_segment = jnp.pad(segment_ids_bt[:, 1:] == segment_ids_bt[:, :-1], ((0, 0), (1, 0)))
  valid = same_segment & (segment_ids_bt != 0)
  return jnp.where(valid, logp, 0.0), jnp.where(valid, entropy, 0.0)


def compute_values(model: llm.Transformer, params, input_ids_bt: jax.Array,
                   segment_ids_bt: Optional[jax.Array] = None) -> jax.Array:
  """Critic values aligned like the log-probs: `values_bt[:, t] = V(input_ids[:, :t])`,
  the value head at position t - 1, i.e. of the state *before* token t is chosen
  (0 where a token opens a segment).

  GAE's delta_t = r_t + gamma V_{t+1} - V_t then credits token t with what choosing it
  changed. The head's own output at t has already read token t: used as V_t it is the
  value after the action (Q(s, a) on an answer's action token), so the baseline would
  cancel exactly the signal the advantage is meant to carry (a perfect critic would
  leave the action token with R - Q(s, a), zero in expectation for every action).
  """
  if segment_ids_bt is None:
    segment_ids_bt = jnp.ones_like(input_ids_bt)
  out_bt = llm.forward(model, params, input_ids_bt, segment_ids_bt)
  values_bt = jnp.pad(out_bt[:, :-1], ((0, 0), (1, 0)))
  same_segment = jnp.pad(segment_ids_bt[:, 1:] == segment_ids_bt[:, :-1], ((0, 0), (1, 0)))
  return jnp.where(same_segment & (segment_ids_bt != 0), values_bt, 0.0)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
