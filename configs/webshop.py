"""WebShop (synthetic catalog, BM25 search), GiGPO on history-free step samples.

Command:   python -m rollx.train --config=configs/webshop.py
           GRPO instead: --config.adv_estimator=grpo
           the original data: --config.custom_envs.WebShop.env_config.data_dir=DIR
           (and the same for WebShopVal), DIR holding items_shuffle*.json and
           items_ins_v2*.json
           curve: python -m rollx.curve --config=configs/webshop.py --minutes=60 --seed=1
           the start, shipped as rollx/models/default_webshop: python -m rollx.recipes.webshop_start
Hardware:  one CPU host; 2 cores are enough, no accelerator needed.
Runtime:   ~55 s per RL step on 2 CPU cores with a second run beside it (2026-11-29); the
           start's rebuild ~31-75 min.
Expected:  GiGPO seed 1, 60 min: mean reward above the random-action baseline, success
           sporadic (2026-11-29, 268758a): docs/results.md#webshop-gigpo-seed1; GRPO:
           docs/results.md#webshop-grpo-seed1

Each env step is one sample: the instruction and the current page (the instruction is
on every page and the item page shows the options chosen, so a history-free prompt
loses nothing a policy needs). GiGPO (Feng et al. 2025) compares steps taken on the
same page across a group's episodes, as in its WebShop results. Validation
instructions come from products no training instruction names (split="validation").
The start is the tool model with the shop's words in its vocabulary, warm started on
random play (no reward, no task signal). Why each setting, and what the start
measures: docs/webshop_recipe.md.
"""

import os

from ml_collections import config_dict

from rollx import config as rollx_config
from rollx import models
from rollx.rollout import prompts


def get_config():
  config = rollx_config.load_file(
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "frozenlake.py"))
  config.exp_name = "webshop_gigpo"
  config.max_steps = 300
  config.eval_steps = 5
  config.rollout_batch_size = 32  # 4 groups x 8 episodes on one instruction each
  config.val_batch_size = 64  # 64 unseen instructions, greedy
  # the longest sample: ~40 prompt tokens + a results page of 3 titles and the search line
  # (<= ~500 tokens with the grid games' tokenizer, about half with the start's shop words)
  # + a 48-token answer
  config.sequence_length = 640
  config.adv_estimator = "gigpo"  # step-level advantages among the same page's steps
  config.gigpo_omega = 1.0
  config.episode_reward_gamma = 0.95  # a purchase after fewer wasted clicks scores higher
  # each step's answer weighs alike: under token-mean a 40-token search outweighs the
  # one-token clicks (options, Buy Now) that decide success
  config.loss_agg_mode = "seq-mean-token-mean"
  config.min_informative_groups = 0  # one rollout round a step: steps stay short on a CPU
  config.max_rollout_rounds = 1
  # the tool model (its copy pretraining lets a click carry a product id off the page), the
  # shop's words in its vocabulary, warm started on random play: rollx.recipes.webshop_start
  config.pretrain = models.DEFAULT_WEBSHOP_MODEL_DIR
  config.warm_start_steps = 0
  config.actor_train.training_args.learning_rate = 2e-4  # half frozenlake's: this start drifts
  config.actor_train.training_args.per_device_train_batch_size = 16  # packed 640-token rows
  config.critic.training_args.per_device_train_batch_size = 16
  config.actor_infer.strategy_args.max_prefill_length = 1024  # a power of two (prefill buckets)
  config.actor_infer.strategy_args.max_cache_length = 1024
  config.actor_infer.generating_args.max_new_tokens = 48

  for manager in (config.train_env_manager, config.val_env_manager):
    manager.env_manager_type = "step"
    manager.history_length = 0
  config.train_env_manager.tags = ("WebShop",)
  config.val_env_manager.tags = ("WebShopVal",)
  config.train_env_manager.num_env_groups = 4
  config.train_env_manager.group_size = 8
  config.val_env_manager.num_env_groups = 64
  config.val_env_manager.group_size = 1

  env_config = dict(
      max_steps=8,  # the oracle needs <= 7 (search, open, <= 3 options, buy); WebShop: 15
      results_per_page=3,  # WebShop shows 10; 3 keeps the longest prompt short on a CPU
      num_products=3000,
      format_penalty=0.0,  # an invalid action costs one of the 8 actions, as in WebShop
      # WebShop's original files (None: the synthetic catalog; here so that a flag can
      # set them, see the command above)
      data_dir=config_dict.placeholder(str),
      human_goals=False)
  config.custom_envs = {}
  config.custom_envs.WebShop = rollx_config.env_entry(
      # success_bonus / option_bonus / option_click_bonus: shapings of the training env's
      # reward only (0 = WebShop's reward), settable by flag
      "WebShop", env_config=dict(env_config, split="train", success_bonus=0.0,
                                 option_bonus=0.0, option_click_bonus=0.0),
      max_tokens_per_step=48,  # a search of up to the whole instruction (<= 44 tokens)
      **prompts.COMPACT_PROMPTS["WebShop"])
  config.custom_envs.WebShopVal = rollx_config.env_entry(
      "WebShop", env_config=dict(env_config, split="validation"),
      max_tokens_per_step=48, **prompts.COMPACT_PROMPTS["WebShop"])
  return config
