"""Policy, value, entropy and KL terms; token-level, masked, aggregated by `loss_agg_mode`.

`actor_loss`, `critic_loss` and `update_kl` are the roles' loss functions in the form
the Trainer takes: `loss(model, params, batch, rng) -> (loss, metrics)` and
`update_kl(model, params, batch)` (bind the config with functools.partial).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from rollx.algos import correction
from rollx.models import logprobs


# Modes the learner runs as token-mean over packed rows: seq-mean-token-mean with each
# sample's response tokens weighted 1 / their count (rollx.trainer.packing.
# per_sample_mean_weights) is the same loss, and its samples then pack and merge.
TOKEN_WEIGHTED_MODES = ("token-mean", "seq-mean-token-mean")


def aggregate(loss_nt: jax.Array, mask_nt: jax.Array, mode: str) -> jax.Array:
  """token-mean: over all response tokens of the batch; seq-mean-token-mean: mean over
  rows of each row's token mean; seq-mean-token-sum: mean over rows of token sums."""
  mask = mask_nt.astype(jnp.float32)
  if mode == "token-mean":
    return jnp.sum(loss_nt * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  rows = jnp.sum(mask, axis=1) > 0
  per_row = jnp.sum(loss_nt * mask, axis=1)
  if mode == "seq-mean-token-mean":
    per_row = per_row / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
  elif mode != "seq-mean-token-sum":
    raise ValueError(f"loss_agg_mode {mode!r}")
  return jnp.sum(per_row) / jnp.maximum(jnp.sum(rows), 1.0)


def ppo_policy_loss(logp, old_logp, advantages, mask, clip_low: float, clip_high: float,
                    dual_clip: Optional[float] = None, agg: str = "token-mean",
                    token_weight: Optional[jax.Array] = None
                    ) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); with dual clip, for A < 0 the
  loss is also capped at -A * dual_clip (r beyond dual_clip stops pushing).
  `token_weight`: each token's loss times it (rollout correction's importance weights,
  rollx.algos.correction), the aggregate's denominator unchanged."""
  ratio = jnp.exp(logp - old_logp)
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  loss = jnp.maximum(unclipped, clipped)
  if dual_clip is not None:
    loss = jnp.where(advantages < 0, jnp.minimum(loss, -advantages * dual_clip), loss)
  if token_weight is not None:
    loss = loss * jax.lax.stop_gradient(token_weight)
  m = mask.astype(jnp.float32)
  count = jnp.maximum(m.sum(), 1.0)
  metrics = {"clip_fraction": jnp.sum((clipped > unclipped) * m) / count,
             "approx_kl": approx_kl(logp, old_logp, mask),
             "ratio_mean": jnp.sum(ratio * m) / count}
  return aggregate(loss, mask, agg), metrics


def approx_kl(logp, old_logp, mask) -> jax.Array:
  """Token mean of 0.5 (log pi - log pi_old)^2 over the response: the second-order
  estimate of KL(pi_old || pi) on the sampled tokens."""
  m = mask.astype(jnp.float32)
  return jnp.sum(0.5 * (logp - old_logp) ** 2 * m) / jnp.maximum(m.sum(), 1.0)


K3_MAX = 10.0


def kl_divergence(logp, ref_logp, kind: str = "k3") -> jax.Array:
  """Per-token KL estimate of pi from pi_ref on sampled tokens, r = pi / pi_ref:
  k1 = log r; k2 = 0.5 (log r)^2; k3 = r^-1 - 1 + log r (>= 0).

  As a loss their expected gradients differ: k2's is the gradient of KL(pi || pi_ref)
  (mode-seeking: on a token where pi_ref is uniform it is an entropy bonus, which fades
  as pi turns deterministic); k3's is the gradient of KL(pi_ref || pi) (mass-covering:
  pi - pi_ref on the logits, a pull back to every action pi_ref allows, however
  deterministic pi is), with a per-token weight 1 - pi_ref / pi that grows without bound
  on a sampled token pi has made unlikely; k2's weight is only log r.
  k3 is capped at K3_MAX (no gradient above it): one such token in a minibatch of
  thousands made a step's mean KL loss 47 (grad norm 249) and its update a jump away
  from both policies (measured: configs/frozenlake.py, seed 1, step 5)."""
  log_ratio = logp - ref_logp
  if kind == "k1":
    return log_ratio
  if kind == "k2":
    return 0.5 * log_ratio ** 2
  if kind != "k3":
    raise ValueError(f"kl_loss_type {kind!r} is not one of k1, k2, k3")
  return jnp.minimum(jnp.exp(-log_ratio) - 1.0 + log_ratio, K3_MAX)


def value_loss(values, old_values, returns, mask, clip: Optional[float], agg: str = "token-mean"):
  """0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped = v_old + clip(v - v_old, +-clip)."""
  loss = (values - returns) ** 2
  if clip is not None and clip > 0:
    clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    loss = jnp.maximum(loss, (clipped - returns) ** 2)
  return 0.5 * aggregate(loss, mask, agg)


# -- the roles' losses ---------------------------------------------------------------------


def loss_weight(mode: str, batch) -> jax.Array:
  """The denominator `aggregate` divides a batch's loss by: response tokens (token-mean,
  merged samples counted by their weight) or sequences with a response (seq-mean-*).
  The Trainer weights microbatches by it, so gradient accumulation is exact."""
  mask = batch["response_mask"].astype(jnp.float32)
  if mode == "token-mean":
    return mask.sum()
  return jnp.sum(mask.sum(axis=1) > 0).astype(jnp.float32)


def actor_loss(config, model, params, batch, rng):
  """PPO policy loss (clip, optional dual clip; weighted by the rollout correction's
  `is_weight` when the batch has it) - entropy bonus + KL loss (use_kl_loss). Log-probs
  at the rollout's sampling temperature, like the old log-probs."""
  del rng
  logp, entropy = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"],
                                            batch.get("score_index"),
                                            correction.sampling_temperature(config))
  mask, agg = batch["response_mask"], config.loss_agg_mode
  low = config.pg_clip_low if config.pg_clip_low is not None else config.pg_clip
  high = config.pg_clip_high if config.pg_clip_high is not None else config.pg_clip
  pg, metrics = ppo_policy_loss(logp, batch["old_logp"], batch["advantages"], mask, low, high,
                                config.dual_clip_ratio if config.dual_clip_loss else None, agg,
                                batch.get("is_weight"))
  ent = aggregate(entropy, mask, agg)
  loss = pg - config.entropy_loss_coef * ent
  if config.use_kl_loss:
    kl = aggregate(kl_divergence(logp, batch["ref_logp"], config.kl_loss_type), mask, agg)
    loss = loss + config.kl_loss_coef * kl
    metrics["kl_loss"] = kl
  metrics.update(pg_loss=pg, entropy=ent)
  return loss, metrics


def update_kl(config, model, params, batch):
  """The trust region's distance: approx KL of the policy from the rollout policy."""
  logp, _ = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"],
                                      batch.get("score_index"),
                                      correction.sampling_temperature(config))
  return approx_kl(logp, batch["old_logp"], batch["response_mask"])


def critic_loss(config, model, params, batch, rng):
  del rng
  values = logprobs.compute_values(model, params, batch["input_ids"], batch["segment_ids"])
  clip = config.value_clip if config.value_clip > 0 else None
  loss = value_loss(values, batch["old_values"], batch["returns"], batch["response_mask"],
                    clip, config.loss_agg_mode)
  return loss, {"value_loss": loss}
