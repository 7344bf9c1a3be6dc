"""Config checks of the algorithm's keys: discounts, clips, KL terms, the advantage
estimator and what it needs of the samples, rollout correction, loss aggregation and
reward normalisation. Called once by rollx.checks.
"""

from __future__ import annotations

import ml_collections

from rollx import config as config_lib
from rollx.algos import correction
from rollx.config_check import Checker


def check_algorithm(c: Checker, cfg) -> None:
  for key in ("gamma", "lambd", "step_reward_gamma", "episode_reward_gamma"):
    if isinstance(cfg[key], float):
      c.rule(0.0 <= cfg[key] <= 1.0, key, f"must be in [0, 1], got {cfg[key]}")
  for key in ("pg_clip", "pg_clip_low", "pg_clip_high", "target_kl", "advantage_clip",
              "max_update_kl"):
    if isinstance(cfg[key], float):
      c.rule(cfg[key] > 0, key, f"must be > 0, got {cfg[key]}")
  for key in ("init_kl_coef", "kl_loss_coef", "async_generation_ratio"):
    if isinstance(cfg[key], float):
      c.rule(cfg[key] >= 0, key, f"must be >= 0, got {cfg[key]}")
  c.choice(cfg, "adv_estimator", "adv_estimator", config_lib.ADV_ESTIMATORS)
  if isinstance(cfg.episode_reward_gamma, float) and cfg.episode_reward_gamma < 1.0:
    # the discount needs each step's reward, which only step-wise samples carry; gae
    # discounts with its own gamma along the tokens
    c.rule(cfg.train_env_manager.env_manager_type == "step", "episode_reward_gamma",
           "< 1 needs step-wise samples (train_env_manager.env_manager_type='step'), got "
           f"env_manager_type={cfg.train_env_manager.env_manager_type!r}")
    c.rule(cfg.adv_estimator != "gae", "episode_reward_gamma",
           "< 1 is for grpo / gigpo / reinforce; gae discounts with gamma")
  if cfg.drop_zero_advantage_samples is True:
    # the samples are chosen before log-probs and values exist (that is the saving)
    c.rule(cfg.adv_estimator != "gae", "drop_zero_advantage_samples",
           "needs advantages without a critic (gae has no exactly-zero advantages): "
           "set it to False with adv_estimator='gae'")
    c.rule(not (isinstance(cfg.init_kl_coef, float) and cfg.init_kl_coef > 0
                and not cfg.use_kl_loss), "drop_zero_advantage_samples",
           "cannot be combined with a KL penalty in the reward (init_kl_coef > 0 without "
           "use_kl_loss): that penalty makes every advantage non-zero")
  if isinstance(cfg.init_kl_coef, float) and cfg.init_kl_coef > 0:
    c.rule(not cfg.use_kl_loss, "init_kl_coef",
           f"{cfg.init_kl_coef} is the KL penalty in the reward, which use_kl_loss=True "
           "replaces by the KL loss (kl_loss_coef): set one of them")
  if cfg.adv_estimator == "gigpo":
    c.rule(cfg.train_env_manager.env_manager_type == "step", "adv_estimator",
           "gigpo's anchor states are env steps: it needs step-wise samples "
           "(train_env_manager.env_manager_type='step'); with trajectory-wise ones use grpo")
  c.choice(cfg, "rollout_correction", "rollout_correction", correction.CHOICES)
  if isinstance(cfg.rollout_correction_threshold, float):
    c.rule(cfg.rollout_correction_threshold > 1, "rollout_correction_threshold",
           f"must be > 1 (C caps weights at C; mis keeps [1/C, C]), got "
           f"{cfg.rollout_correction_threshold}")
  if isinstance(cfg.dual_clip_ratio, float):
    c.rule(cfg.dual_clip_ratio > 1, "dual_clip_ratio",
           f"must be > 1 (the cap sits beyond the clip range), got {cfg.dual_clip_ratio}")
  c.choice(cfg, "loss_agg_mode", "loss_agg_mode", config_lib.LOSS_AGG_MODES)
  c.choice(cfg, "kl_loss_type", "kl_loss_type", config_lib.KL_ESTIMATORS)
  if isinstance(cfg.reward_normalization, (ml_collections.ConfigDict, dict)):
    c.choice(cfg.reward_normalization, "grouping", "reward_normalization.grouping",
             config_lib.NORM_GROUPINGS)
    c.choice(cfg.reward_normalization, "method", "reward_normalization.method",
             config_lib.NORM_METHODS)
