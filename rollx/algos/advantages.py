"""Advantages by `adv_estimator`, on token-level arrays [N, T] with `response_mask`.

Rewards live on response tokens only: a trajectory's (normalised) score sits on
its last response token. Everything that runs "over time" runs over response
tokens only: template/observation tokens between turns are skipped (they carry no
action), so a multi-turn trajectory is one decision sequence.

    ADVANTAGES[config.adv_estimator](inputs, config) -> (advantages_nt, returns_nt)

`inputs` holds arrays: response_mask, scores [N] (episode score or, step-wise,
the step reward), group_ids [N], and per estimator: values (gae),
episode_ids / step_index / anchor_ids / episode_scores (step-wise rows, gigpo),
token_kl (the KL penalty per token, already scaled; 0 when off).

Step-wise rows (one per env step, `episode_ids` shared by the rows of an episode)
are, for gae / grpo / reinforce, one decision sequence again: the episode's
response tokens in step order (`EpisodeView`), with the episode score on the
last one. So these estimators give a step-wise batch exactly the advantages of
the trajectory-wise sample of the same episode (history-free prompts change the
policy's inputs, not the credit assignment). GiGPO is the estimator that uses
the steps themselves (anchor states). The view is built on host, from concrete
arrays: compute_advantages runs eagerly once per step.

Eager JAX compiles each op once per shape, and a step's sample count changes every
step: rows (and episodes) are padded to a power of two (`pad_rows`: no response
tokens, weight 0, ids of their own), so the compiled ops are reused (bench/advantages.py,
~700 step rows of varying count: GiGPO 1216 -> 54 ms per step, GRPO 158 -> 125 ms).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

Arrays = Dict[str, jax.Array]
EPS = 1e-6


def group_normalize(x: jax.Array, group_ids: jax.Array, method: str, num_groups: int,
                    weights: jax.Array | None = None) -> jax.Array:
  """(x - mean_g) / (std_g + eps) for `mean_std`, x - mean_g for `mean`, x for `identity`.

  `weights` make the group statistics weighted (e.g. 1 / steps of the episode, so
  that each episode counts once however many step-wise rows it has)."""
  if method == "identity":
    return x
  w = jnp.ones_like(x) if weights is None else weights
  total = jnp.maximum(jax.ops.segment_sum(w, group_ids, num_groups), 1e-12)
  mean = jax.ops.segment_sum(w * x, group_ids, num_groups) / total
  # A group whose members all scored alike carries no signal: exactly 0. Its float
  # mean is a rounding error away from the score (8 x 9.4 in float32), and dividing
  # that by std + eps would give every member a large advantage of one sign.
  counted = w > 0
  high = jax.ops.segment_max(jnp.where(counted, x, -jnp.inf), group_ids, num_groups)
  low = jax.ops.segment_min(jnp.where(counted, x, jnp.inf), group_ids, num_groups)
  centered = jnp.where((high == low)[group_ids], 0.0, x - mean[group_ids])
  if method == "mean":
    return centered
  var = jax.ops.segment_sum(w * centered**2, group_ids, num_groups) / total
  return centered / (jnp.sqrt(var)[group_ids] + EPS)


def last_token_rewards(scores_n: jax.Array, response_mask_nt: jax.Array) -> jax.Array:
  """[N, T] with each row's score on its last response token."""
  t = response_mask_nt.shape[1]
  last = t - 1 - jnp.argmax(response_mask_nt[:, ::-1] > 0, axis=1)
  has = response_mask_nt.sum(axis=1) > 0
  return jnp.where(has[:, None] & (jnp.arange(t)[None] == last[:, None]), scores_n[:, None], 0.0)


def discounted_gae(rewards_nt, values_nt, mask_nt, gamma: float, lambd: float):
  """GAE over response tokens (mask 1), skipping the others; returns (advantages, returns).

  delta_t = r_t + gamma V_next - V_t; A_t = delta_t + gamma lambda A_next, where
  "next" is the next response token of the row (V_next = 0 after the last).
  """
  def step(carry, x):
    next_value, next_adv = carry
    r, v, m = x
    delta = r + gamma * next_value - v
    adv = delta + gamma * lambd * next_adv
    carry = (jnp.where(m > 0, v, next_value), jnp.where(m > 0, adv, next_adv))
    return carry, jnp.where(m > 0, adv, 0.0)

  n = rewards_nt.shape[0]
  xs = (rewards_nt.T, values_nt.T, mask_nt.T)
  _, adv_tn = jax.lax.scan(step, (jnp.zeros(n), jnp.zeros(n)), xs, reverse=True)
  adv = adv_tn.T
  return adv, (adv + values_nt) * mask_nt


def _num_groups(inputs: Arrays) -> int:
  return int(inputs["group_ids"].shape[0])  # ids are < N by construction (collate)


def gae(inputs: Arrays, config) -> Tuple[jax.Array, jax.Array]:
  mask = inputs["response_mask"]
  rewards = last_token_rewards(normalized_scores(inputs, config), mask) - inputs["token_kl"]
  return discounted_gae(rewards * mask, inputs["values"] * mask, mask, config.gamma, config.lambd)


def grpo(inputs: Arrays, config) -> Tuple[jax.Array, jax.Array]:
  """Group-normalised episode score on every response token (a group with equal
  scores gets zero advantage: no signal)."""
  mask = inputs["response_mask"]
  adv = normalized_scores(inputs, config)[:, None] * mask - _kl_to_go(inputs, config)
  return adv, adv


def reinforce(inputs: Arrays, config) -> Tuple[jax.Array, jax.Array]:
  """Discounted reverse cumulative sum of (normalised) rewards over response tokens."""
  mask = inputs["response_mask"]
  rewards = last_token_rewards(normalized_scores(inputs, config), mask) - inputs["token_kl"]
  returns, _ = discounted_gae(rewards * mask, jnp.zeros_like(rewards), mask, config.gamma, 1.0)
  return returns, returns


def gigpo(inputs: Arrays, config) -> Tuple[jax.Array, jax.Array]:
  """GiGPO (step-wise samples): A = A_episode + omega * A_step.

  A_episode: the episode's score normalised within its env group (same level).
  A_step: the step's discounted return R_t = sum_k gamma^(k-t) r_k normalised
  within its anchor group: steps of the same env group whose observations are
  identical (`anchor_ids`). Norm: std (`mean_std`) or 1 (`mean`).
  """
  mask = inputs["response_mask"]
  n = _num_groups(inputs)
  method = "mean_std" if config.reward_normalization.method == "mean_std" else "mean"
  episode_ids = inputs["episode_ids"]
  rows_per_episode = jax.ops.segment_sum(jnp.ones_like(inputs["scores"]), episode_ids, n)
  weight = inputs.get("row_weight", jnp.ones_like(inputs["scores"]))
  a_episode = group_normalize(inputs["episode_scores"], inputs["group_ids"], method, n,
                              weights=weight / rows_per_episode[episode_ids])
  returns = step_returns(inputs["scores"], inputs["episode_ids"], inputs["step_index"],
                         config.step_reward_gamma)
  a_step = group_normalize(returns, inputs["anchor_ids"], method, n, weights=weight)
  adv = (a_episode + config.gigpo_omega * a_step)[:, None] * mask - _kl_to_go(inputs, config)
  return adv, adv


def step_returns(rewards_n, episode_ids_n, step_index_n, gamma: float) -> jax.Array:
  """R_t = sum_{k >= t} gamma^(k - t) r_k within each episode."""
  same = episode_ids_n[:, None] == episode_ids_n[None, :]
  later = step_index_n[None, :] >= step_index_n[:, None]
  power = jnp.where(same & later, step_index_n[None, :] - step_index_n[:, None], 0)
  return jnp.sum(jnp.where(same & later, gamma**power * rewards_n[None, :], 0.0), axis=1)


def discounted_episode_scores(rewards_n, episode_ids_n, step_index_n, gamma: float) -> np.ndarray:
  """[N] each row's episode score sum_t gamma^t r_t, t counted from the episode's first
  step (step-wise rows: one env step each, `rewards_n` the step's reward)."""
  rewards, episodes = np.asarray(rewards_n, np.float64), np.asarray(episode_ids_n)
  steps = np.asarray(step_index_n)
  _, episode_of_row = np.unique(episodes, return_inverse=True)
  first = np.full(episode_of_row.max(initial=-1) + 1, np.iinfo(np.int64).max)
  np.minimum.at(first, episode_of_row, steps)
  scores = np.zeros_like(first, np.float64)
  np.add.at(scores, episode_of_row, gamma ** (steps - first[episode_of_row]) * rewards)
  return scores[episode_of_row].astype(np.float32)


def normalized_scores(inputs: Arrays, config) -> jax.Array:
  """Scores normalised by `reward_normalization` (grouping: group_ids / tag_ids / batch)."""
  rn = config.reward_normalization
  ids = {"traj_group_id": inputs["group_ids"], "tags": inputs.get("tag_ids"),
         "batch": jnp.zeros_like(inputs["group_ids"])}[rn.grouping]
  return group_normalize(inputs["scores"], ids, rn.method, _num_groups(inputs),
                         weights=inputs.get("row_weight"))


ID_KEYS = ("group_ids", "episode_ids", "anchor_ids", "tag_ids")


def bucket(n: int, minimum: int = 8) -> int:
  """The power of two >= n (at least `minimum`): the padded size of an axis."""
  return max(minimum, 1 << (max(int(n), 1) - 1).bit_length())


def pad_rows(inputs: Arrays, rows: int, width: int) -> Arrays:
  """`inputs` padded to [rows] / [rows, width]. A padding row has no response tokens,
  zeros elsewhere, `row_weight` 0 (it counts in no group statistic) and ids of its own
  (N + i: ids of real rows are < N), so that it joins no group, episode or anchor."""
  n = len(inputs["response_mask"])
  out = {}
  for key, value in inputs.items():
    if value is None:
      out[key] = value
      continue
    value = np.asarray(value)
    padded = np.zeros((rows,) + ((width,) if value.ndim == 2 else value.shape[1:]), value.dtype)
    padded[(slice(0, n),) + tuple(slice(0, d) for d in value.shape[1:])] = value
    if key in ID_KEYS:
      padded[n:] = n + np.arange(rows - n)
    out[key] = jnp.asarray(padded)
  if "row_weight" not in inputs:
    out["row_weight"] = jnp.asarray((np.arange(rows) < n).astype(np.float32))
  return out


def _shape_stable(estimator: Callable) -> Callable:
  """`estimator` on inputs padded to bucketed sizes; its outputs cut back (module doc)."""
  def run(inputs: Arrays, config) -> Tuple[jax.Array, jax.Array]:
    n, t = np.shape(inputs["response_mask"])
    adv, returns = estimator(pad_rows(inputs, bucket(n, 64), bucket(t)), config)
    return jnp.asarray(np.asarray(adv)[:n, :t]), jnp.asarray(np.asarray(returns)[:n, :t])
  run.__doc__ = estimator.__doc__
  return run


def _kl_to_go(inputs: Arrays, config) -> jax.Array:
  """KL-in-reward for estimators without a critic: penalty still to come on each token."""
  kl = inputs["token_kl"]
  mask = inputs["response_mask"]
  to_go = jnp.cumsum(kl[:, ::-1], axis=1)[:, ::-1]
  return to_go * mask


class EpisodeView:
  """Step-wise rows [N, T] <-> episodes [E, L]: each episode's response tokens,
  rows in `step_index` order, tokens in position order (L = the longest episode)."""

  def __init__(self, response_mask_nt, episode_ids_n, step_index_n):
    mask = np.asarray(response_mask_nt) > 0
    episodes, self.first_row, episode_of_row = np.unique(
        np.asarray(episode_ids_n), return_index=True, return_inverse=True)
    order = np.lexsort((np.asarray(step_index_n), episode_of_row))  # by episode, then step
    r, self.t = np.nonzero(mask[order])  # row-major: step order, then position
    self.row = order[r]
    self.e = episode_of_row[self.row]
    counts = np.bincount(self.e, minlength=len(episodes))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    self.pos = np.arange(len(self.e)) - starts[self.e]
    self.num_episodes, self.length = len(episodes), int(max(counts.max(initial=0), 1))
    self.shape_nt = mask.shape

  def to_episodes(self, x_nt) -> jax.Array:
    out = np.zeros((self.num_episodes, self.length), np.float32)
    out[self.e, self.pos] = np.asarray(x_nt)[self.row, self.t]
    return jnp.asarray(out)

  def to_rows(self, x_el) -> jax.Array:
    out = np.zeros(self.shape_nt, np.float32)
    out[self.row, self.t] = np.asarray(x_el)[self.e, self.pos]
    return jnp.asarray(out)

  def per_episode(self, x_n) -> jax.Array:
    """A per-row value that is constant within an episode (score, group, tag)."""
    return jnp.asarray(np.asarray(x_n)[self.first_row])


def episode_view(inputs: Arrays) -> Optional[EpisodeView]:
  """The EpisodeView of step-wise inputs; None when every episode is a single row."""
  if "episode_ids" not in inputs:
    return None
  episode_ids = np.asarray(inputs["episode_ids"])
  if len(np.unique(episode_ids)) == len(episode_ids):
    return None
  return EpisodeView(inputs["response_mask"], episode_ids,
                     inputs.get("step_index", np.zeros_like(episode_ids)))


def on_episodes(estimator: Callable, shape_stable: bool = True) -> Callable:
  """`estimator` on the episodes of step-wise inputs (unchanged on trajectory-wise ones);
  the episodes padded to bucketed sizes unless `shape_stable` is False (the reference
  path of tests and bench/advantages.py)."""
  inner = _shape_stable(estimator) if shape_stable else estimator

  def run(inputs: Arrays, config) -> Tuple[jax.Array, jax.Array]:
    view = episode_view(inputs)
    if view is None:
      return estimator(inputs, config)
    episodes = {"response_mask": view.to_episodes(inputs["response_mask"]),
                "token_kl": view.to_episodes(inputs["token_kl"]),
                "scores": view.per_episode(inputs["episode_scores"])}
    # group / tag ids renumbered 0..E-1: the normalisers size their segments by rows
    for key in ("group_ids", "tag_ids"):
      if inputs.get(key) is not None:
        episodes[key] = jnp.asarray(np.unique(np.asarray(view.per_episode(inputs[key])),
                                              return_inverse=True)[1].astype(np.int32))
    if "values" in inputs:
      episodes["values"] = view.to_episodes(inputs["values"])
    if inputs.get("row_weight") is not None:
      episodes["row_weight"] = view.per_episode(inputs["row_weight"])
    adv, returns = inner(episodes, config)
    return view.to_rows(adv), view.to_rows(returns)
  run.__doc__ = estimator.__doc__
  return run


ADVANTAGES: Dict[str, Callable] = {"gae": on_episodes(gae), "grpo": on_episodes(grpo),
                                   "reinforce": on_episodes(reinforce), "gigpo": gigpo}


def informative(adv_nt: jax.Array) -> jax.Array:
  """[N] bool: the sample has a non-zero advantage on some token (a policy gradient)."""
  return jnp.any(adv_nt != 0, axis=1)


def num_informative_groups(has_gradient_n, group_ids_n) -> int:
  """How many groups have a sample with a policy gradient (dynamic sampling's count)."""
  return len(np.unique(np.asarray(group_ids_n)[np.asarray(has_gradient_n)]))


def samples_to_train(has_gradient_n) -> np.ndarray:
  """Indices of the samples the actor trains on under `drop_zero_advantage_samples`:
  those with a policy gradient (`informative`), or all of them where none has one,
  so that such a step trains as it would without dropping (the KL loss over the whole
  batch) rather than taking an optimizer step on an empty batch. (It does not rescue a
  policy collapsed into one answer: measured on configs/frozenlake.py, seed 3.)"""
  keep = np.flatnonzero(has_gradient_n)
  return keep if len(keep) else np.arange(len(has_gradient_n))


def whiten(adv_nt: jax.Array, mask_nt: jax.Array) -> jax.Array:
  """Zero mean, unit std over the tokens of `mask_nt`; 0 elsewhere."""
  count = jnp.maximum(mask_nt.sum(), 1.0)
  mean = (adv_nt * mask_nt).sum() / count
  std = jnp.sqrt((((adv_nt - mean) * mask_nt) ** 2).sum() / count)
  return (adv_nt - mean) / (std + EPS) * mask_nt


def compute_advantages(inputs: Arrays, config) -> Tuple[jax.Array, jax.Array]:
  """Registry lookup, then `whiten_advantages` and `advantage_clip`."""
  if config.adv_estimator not in ADVANTAGES:
    raise ValueError(f"adv_estimator {config.adv_estimator!r} is not one of {sorted(ADVANTAGES)}")
  n, t = np.shape(inputs["response_mask"])
  gamma = config.get("episode_reward_gamma", 1.0)
  if gamma < 1.0 and "episode_ids" in inputs:  # rollx.checks: step-wise rows only
    inputs = dict(inputs, episode_scores=jnp.asarray(discounted_episode_scores(
        inputs["scores"], inputs["episode_ids"], inputs["step_index"], gamma)))
  inputs = pad_rows(inputs, bucket(n, 64), bucket(t))
  adv, returns = ADVANTAGES[config.adv_estimator](inputs, config)
  # Samples without a policy gradient (a group that scored alike) stay at exactly 0:
  # whitening must not count them, nor give them a non-zero advantage back (with
  # drop_zero_advantage_samples they leave the batch).
  mask = inputs["response_mask"] * informative(adv)[:, None]
  if config.whiten_advantages:
    adv = whiten(adv, mask)
  if config.advantage_clip is not None:
    adv = jnp.clip(adv, -config.advantage_clip, config.advantage_clip)
  return jnp.asarray(np.asarray(adv * mask)[:n, :t]), jnp.asarray(np.asarray(returns)[:n, :t])


def for_batch(batch, per_sample: Dict[str, np.ndarray], config, kl_coef: float = 0.0
              ) -> Tuple[np.ndarray, np.ndarray]:
  """Advantages and returns [N, T] of a RolloutBatch's samples: the one place the
  estimator's inputs are assembled. `per_sample` holds response_mask and, as the config
  needs them, old_logp / ref_logp (KL in the reward, scaled by `kl_coef`) and
  old_values (gae)."""
  tag_ids = {t: i for i, t in enumerate(sorted(set(batch.tags)))}
  anchors = list(zip(batch.group_ids.tolist(), batch.anchors))
  anchor_ids = {a: i for i, a in enumerate(dict.fromkeys(anchors))}
  mask = per_sample["response_mask"]
  token_kl = np.zeros_like(mask, dtype=np.float32)
  if config.init_kl_coef > 0 and not config.use_kl_loss:
    token_kl = kl_coef * (per_sample["old_logp"] - per_sample["ref_logp"]) * mask
  inputs = {
      "response_mask": jnp.asarray(mask),
      "scores": jnp.asarray(batch.rewards), "episode_scores": jnp.asarray(batch.episode_scores),
      "group_ids": jnp.asarray(batch.group_ids), "episode_ids": jnp.asarray(batch.episode_ids),
      "step_index": jnp.asarray(batch.step_index),
      "anchor_ids": jnp.asarray([anchor_ids[a] for a in anchors], jnp.int32),
      "tag_ids": jnp.asarray([tag_ids[t] for t in batch.tags], jnp.int32),
      "token_kl": jnp.asarray(token_kl),
      "values": jnp.asarray(per_sample.get("old_values", np.zeros_like(token_kl))),
  }
  adv, returns = compute_advantages(inputs, config)
  return np.asarray(adv), np.asarray(returns)
