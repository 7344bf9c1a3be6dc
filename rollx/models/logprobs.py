"""Per-token log-probs and entropies of a packed batch, shared by actor and reference.

Alignment: `logp_bt[:, t] = log p(input_ids[:, t] | input_ids[:, :t])`, i.e. each
value sits on the token it scores, so `response_mask_bt` (1 on generated tokens)
selects exactly the generated tokens' log-probs. Position 0 and the first token of
each packed segment have no prediction and get 0.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from rollx.models import llm


def logprobs_from_logits(logits_btv: jax.Array, input_ids_bt: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """(logp_bt, entropy_bt) aligned to the scored token; fp32."""
  logp_btv = jax.nn.log_softmax(logits_btv[:, :-1].astype(jnp.float32), axis=-1)
  targets = input_ids_bt[:, 1:]
  logp = jnp.take_along_axis(logp_btv, targets[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)
  pad = ((0, 0), (1, 0))
  return jnp.pad(logp, pad), jnp.pad(entropy, pad)


def compute_logprobs(model: llm.Transformer, params, input_ids_bt: jax.Array,
                     segment_ids_bt: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
  """Log-probs and entropies of `input_ids` under `params`; segment 0 = padding."""
  if segment_ids_bt is None:
    segment_ids_bt = jnp.ones_like(input_ids_bt)
  logits = llm.forward(model, params, input_ids_bt, segment_ids_bt)
  logp, entropy = logprobs_from_logits(logits, input_ids_bt)
  # A token opening a segment is not predicted by the previous segment's last token.
  same_segment = jnp.pad(segment_ids_bt[:, 1:] == segment_ids_bt[:, :-1], ((0, 0), (1, 0)))
  valid = same_segment & (segment_ids_bt != 0)
  return jnp.where(valid, logp, 0.0), jnp.where(valid, entropy, 0.0)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
