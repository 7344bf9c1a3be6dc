"""Rollout correction: importance weights for tokens the servers sampled from a policy
other than the one actor_train's update starts from.

Three policies meet in one actor update (the names of AReaL's decoupled PPO, Fu et al.
2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System"):
- behaviour, pi_b: what a server sampled each token with. Its weights may be versions
  old (async_generation_ratio > 0), it samples from softmax(logits / T) truncated by
  top-k / top-p, and its numerics (KV cache, dtype, kernels) are not the trainer's. The
  server returns log pi_b of every token (`behaviour_logp`).
- proximal, pi_old: actor_train's log-prob pass at the start of the step (`old_logp`),
  at the rollout temperature. PPO's ratio pi_theta / pi_old and its clip are taken
  around it, whatever the mode below.
- pi_theta: the policy being updated.

The samples come from pi_b, so the policy gradient is off by w = pi_old / pi_b on every
token; `rollout_correction` picks what to do with w (C = rollout_correction_threshold):
- none: ignore it (right when w = 1: sync, temperature 1, matching numerics);
- tis: token-level truncated importance sampling, min(w, C) (Yao et al. 2025, "Your
  Efficient RL Framework Secretly Brings You Off-Policy RL Training");
- mis: masked importance sampling: w where 1/C <= w <= C, 0 elsewhere (a token the two
  sides disagree on that much says more about the mismatch than about the task);
- seq_tis: sequence level: min(prod_t w_t, C) on every token of the sample;
- decoupled: AReaL's decoupled objective, w untruncated, tokens with w > C dropped
  (AReaL's cap on the behaviour weight).
`auto` (the default) is tis whenever the config makes the rollouts' data differ from
actor_train's policy (`off_policy_reasons`: async or stale weights, sampling other than
the full softmax at temperature 1, kept keys/values of older weights, reduced-precision
or other-dtype inference), none otherwise; `start_line` says which mode is in force and
why, as the run's first lines. Tokens without a behaviour log-prob (symmetric
views, scripted data) get weight 1. The weights are data for the loss (no gradient
flows through them); the loss keeps its denominator, so a masked token counts as zero.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

MODES = ("none", "tis", "mis", "seq_tis", "decoupled")
CHOICES = ("auto",) + MODES
_MAX_LOG_WEIGHT = 60.0  # exp() stays finite in float32; any weight this large is cut anyway


def sampling_temperature(config) -> float:
  """The temperature of the train rollouts' sampling distribution (greedy sampling has
  none: the trainer then scores the plain softmax)."""
  t = float(config.actor_infer.generating_args.temperature)
  return t if t > 0 else 1.0


def off_policy_reasons(config) -> List[str]:
  """Why the train rollouts' tokens come from another policy than the one actor_train
  scores, each naming its setting; [] when the two agree up to fp32 numerics."""
  infer, train = config.actor_infer, config.actor_train
  g = infer.generating_args
  reasons = []
  if config.async_generation_ratio > 0:
    reasons.append(f"async_generation_ratio={config.async_generation_ratio} > 0")
  if float(g.temperature) != 1.0:
    reasons.append(f"temperature={g.temperature} != 1")
  # the servers' log-probs are of the truncated distribution, the trainer's of the softmax
  if float(g.top_p) < 1.0:
    reasons.append(f"top_p={g.top_p} < 1")
  if int(g.top_k) > 0:
    reasons.append(f"top_k={g.top_k} > 0")
  # synchronous rollouts between weight syncs: up to k - 1 versions stale
  if train.model_update_frequency > 1:
    reasons.append(f"model_update_frequency={train.model_update_frequency} > 1")
  if infer.strategy_args.keep_prefix_across_updates and infer.strategy_args.reuse_kv:
    reasons.append("keep_prefix_across_updates=True (keys/values of older weights)")
  infer_dtype, train_dtype = infer.model_args.dtype, train.model_args.dtype
  if infer_dtype != train_dtype:
    reasons.append(f"inference dtype {infer_dtype} != training dtype {train_dtype}")
  elif infer_dtype != "fp32":  # the same low precision, other kernels and shapes
    reasons.append(f"inference dtype {infer_dtype} (reduced precision)")
  return reasons


def resolve(config) -> str:
  """`rollout_correction` with `auto` resolved."""
  mode = config.rollout_correction
  if mode != "auto":
    return mode
  return "tis" if off_policy_reasons(config) else "none"


def start_line(config) -> str:
  """The run's line on the correction in force and why, e.g. `rollout correction: tis
  (auto: top_p=0.9 < 1)`."""
  reasons = ", ".join(off_policy_reasons(config))
  if config.rollout_correction != "auto":
    why = f"rollout_correction={config.rollout_correction}" + (
        f"; off-policy: {reasons}" if reasons else "")
  else:
    why = f"auto: {reasons}" if reasons else (
        "auto: on-policy: synchronous, weights synced every step, full softmax at "
        "temperature 1, fp32 inference as training")
  return f"rollout correction: {resolve(config)} ({why})"


def importance_weights(mode: str, old_logp_nt: np.ndarray, behaviour_logp_nt: np.ndarray,
                       response_mask_nt: np.ndarray, threshold: float
                       ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(applied weights [N, T] float32, raw weights w [N, T], changed [N, T] bool: the
  tokens whose applied weight is not w, i.e. truncated or masked). Sequence-level
  modes put the sequence's weight on each of its response tokens. 1 off the response
  and where the behaviour log-prob is unknown (NaN)."""
  response = response_mask_nt > 0
  known = response & np.isfinite(behaviour_logp_nt)
  log_w = np.where(known, old_logp_nt.astype(np.float64) - np.nan_to_num(behaviour_logp_nt), 0.0)
  if mode == "seq_tis":
    log_w = np.where(response, log_w.sum(axis=1, keepdims=True), 0.0)
  raw = np.exp(np.minimum(log_w, _MAX_LOG_WEIGHT))
  c = float(threshold)
  if mode == "none":
    applied = np.ones_like(raw)
  elif mode in ("tis", "seq_tis"):
    applied = np.minimum(raw, c)
  elif mode == "mis":
    applied = np.where((raw >= 1.0 / c) & (raw <= c), raw, 0.0)
  elif mode == "decoupled":
    applied = np.where(raw <= c, raw, 0.0)
  else:
    raise ValueError(f"rollout_correction {mode!r} is not one of {MODES}")
  applied = np.where(response, applied, 1.0)
  changed = response & (applied != raw) & (mode != "none")
  return applied.astype(np.float32), raw.astype(np.float32), changed


def mismatch_metrics(old_logp_nt: np.ndarray, behaviour_logp_nt: np.ndarray,
                     response_mask_nt: np.ndarray, token_versions_nt: np.ndarray,
                     version: int, raw_nt: np.ndarray, changed_nt: np.ndarray
                     ) -> Dict[str, float]:
  """How far the trainer's old log-probs are from the servers' on the response tokens
  that have both (each counted by its response-mask weight, merged samples by their
  count): mean |log pi_old - log pi_b|, the k3 estimate of KL(pi_b || pi_old) (Schulman
  2020, "Approximating KL divergence"), the weights' mean / max and the fraction the
  correction changed; the mismatch again per policy-version lag (`version` minus each
  token's version: 0 in sync mode)."""
  weight = np.where(np.isfinite(behaviour_logp_nt), response_mask_nt, 0.0).astype(np.float64)
  total = weight.sum()
  if total <= 0:
    return {}
  mean = lambda x: float((x * weight).sum() / total)
  delta = np.where(weight > 0, old_logp_nt - np.nan_to_num(behaviour_logp_nt), 0.0)
  log_r = np.minimum(delta, _MAX_LOG_WEIGHT)
  out = {
      "rollout_correction/mismatch_abs": mean(np.abs(delta)),
      "rollout_correction/mismatch_k3": mean(np.exp(log_r) - 1.0 - log_r),
      "rollout_correction/weight_mean": mean(raw_nt),
      "rollout_correction/weight_max": float(raw_nt[weight > 0].max()),
      "rollout_correction/changed_fraction": mean(changed_nt),
  }
  lag = version - token_versions_nt
  for k in np.unique(lag[weight > 0]):
    at = (lag == k) & (weight > 0)
    out[f"rollout_correction/mismatch_abs_lag{int(k)}"] = float(
        (np.abs(delta) * weight)[at].sum() / weight[at].sum())
  out["rollout_correction/version_lag_mean"] = mean(lag)
  return out
