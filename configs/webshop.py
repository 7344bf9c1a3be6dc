"""WebShop (synthetic catalog, BM25 search), GiGPO on history-free step samples.

Command:   python -m rollx.train --config=configs/webshop.py
           GRPO instead: --config.adv_estimator=grpo
           the original data: --config.custom_envs.WebShop.env_config.data_dir=DIR
           (and the same for WebShopVal), DIR holding items_shuffle*.json and
           items_ins_v2*.json
           learning curve: python -m rollx.curve --config=configs/webshop.py --minutes=60
           --seed=1
Hardware:  one CPU host; 2 cores are enough, no accelerator needed.
Runtime:   (2026-11-29, 2 CPU cores) ~55 s per RL step with a second run beside it
           (rollout of 32 episodes x <= 8 actions, ~200-token pages with the start's
           shop words); the start is shipped (rollx/models/default_webshop; its recipe
           takes ~31-75 min).
Expected:  raises the mean reward; success stays sporadic. GiGPO and GRPO, seed 1,
           60 min each, the two runs at once on the 2 cores (71 / 76 steps of 32
           episodes; 2026-11-29, commit 268758a): greedy validation on 64 unseen
           instructions, mean reward 0.194 at step 0 -> mean 0.371 / 0.354 over the
           later validations (best 0.446 at step 20 / 0.471 at step 25), 0.387 / 0.294
           at the end; validation success 2 of 64 at step 0, 1-2 of 64 at 5 of 14 / 7 of
           15 later validations, 0 at the end; 35 / 21 training successes in all. The
           start before (its new words at their pieces' mean, copying less exactly):
           0.129 -> mean 0.237 / 0.218, 4 / 9 training successes.
           On these instructions (bench/webshop_env.py) a uniformly random valid action
           each step (the start's prior: a search of a random span of the instruction,
           then random clicks) scores a mean purchase reward of 0.130 and succeeds on
           1.2%; a random shopper (a random span searched, a random result opened, a
           random value in each option group, then Buy Now) 0.590 and 15.0%; copying
           words without knowing which matter (three of the instruction's first eight
           searched, the first result opened, the options the instruction names chosen)
           0.462 and 11.9%; the same with the whole instruction searched
           0.959 and 85.5%; an oracle that reads the goal 100%.
           What holds success back: copies and option clicks. The start copies few
           searches exactly (40 of 253 sampled first searches are a span of the
           instruction); greedy, it loops on one option click or Description / < Prev. A
           policy that searched a random span, opened the first result, chose the options
           the instruction names and bought would succeed on 47% (3% without the option
           clicks; searches of one to three words, the start shipped before, cap it at
           1.8%). That start, RL at token-mean and learning rate 5e-4, made 144 / 238
           steps and its greedy policy ended searching one fixed query (`search[free]`)
           for every instruction: best 0.147 / 0.129, 0.088 / 0.078 at the end.
           The any-span start at those settings peaked by step 10 (0.247 / 0.243) and
           fell back (0.151 / 0.153).
           Tried, not shipped (2026-11-29, seed 1, GiGPO / GRPO at once): a success bonus
           of 1 on the training env (`--config.custom_envs.WebShop.env_config.
           success_bonus=1.0`; verl-agent trains on 10 x success alone): 71 / 73 steps,
           mean 0.364 / 0.370 over the later validations, success 1-2 of 64 at 9 / 4 of
           14, 0 at the end, 23 / 24 training successes; with the discount off as well
           (`--config.episode_reward_gamma=1.0 --config.step_reward_gamma=1.0`; stopped
           after 46 min, at 52 / 55 steps): mean 0.366 / 0.349 over the later validations,
           best 0.432 / 0.408 by step 25, then 0.304 / 0.287 at step 50 as invalid actions
           rose to 41% / 45% of validation actions (a wasted action no longer costs),
           success at most 3 of 64; the bonus with twice the instructions a step
           (`--config.train_env_manager.num_env_groups=8
           --config.train_env_manager.group_size=4`, 71 / 71 steps): mean 0.369 / 0.367
           (best 0.445 / 0.427), success at most 2 of 64, 0 at the end, 21 / 30 training
           successes; the success bonus and an option bonus of 1
           (`--config.custom_envs.WebShop.env_config.option_bonus=1.0`: r_type x the
           share of the goal's options chosen right, paid at the purchase; 67 / 68
           steps): mean 0.347 / 0.359 (best 0.419 / 0.410), success at most 2 of 64, 0 at
           the end, 25 / 22 training successes (its last GiGPO checkpoint, sampled as
           below, clicked 4 options in 134 item-page actions); the success bonus and an
           option bonus of 1 paid at the click that chooses a goal option right
           (`--config.custom_envs.WebShop.env_config.option_click_bonus=1.0`; stopped
           after 38 min, 37 / 37 steps, as validation fell): mean 0.344 / 0.297 over the 7
           later validations, 0.246 / 0.222 at step 35 (GRPO's invalid actions 32%),
           success at most 2 of 64, 15 / 15 training successes; the success bonus, the
           option bonus at the purchase and a KL loss six times as strong
           (`--config.kl_loss_coef=0.3`, so that RL keeps the start's option clicks while
           the bonus pays the right ones; 51 / 53 steps on a slower day): mean 0.393 /
           0.382 over the 10 later validations (best 0.440 / 0.448), 0.409 / 0.374 at the
           end; success 1-4 of 64 at 6 / 5 of 10, 2 / 1 at the end; 17 / 13 training
           successes; its last GiGPO checkpoint, sampled as below, still bought at once
           (3 option clicks in 133 item-page actions).
           Tried, not shipped (2026-11-30, seed 1, GRPO started 11 min after GiGPO, then
           both at once): a start that keeps clicking options, the shipped start trained
           further on random-shopper transcripts (`python -m rollx.recipes.webshop_start
           --shopper_steps=150`; no goal read, every choice random) and RL from it at the
           shipped settings: greedy 0.254 and 3 of 64 at step 0 (39% invalid actions);
           GiGPO 73 steps, mean 0.303 over the 14 later validations, success 1-5 of 64,
           0 at the end; GRPO 77 steps, mean 0.341, 0.395 at the end, success 8 / 9 of 64
           at steps 20 / 25, then 1-5, 2 at the end; 83 / 96 training successes (shipped
           start: 35 / 21). Training option clicks stayed at ~25% of valid actions for
           GiGPO; GRPO's fell to ~12% after step 30. Sampled as below, the start clicked
           190 options (64 of the right value, chance) and 176 values its page does not
           list (invalid: "white", "6", "3 ft", a prior over values, not a copy of the
           page), 10 successes of 128; the last GiGPO checkpoint 47 options (16 right,
           still chance), 72 invalid, 7 successes. RL did not learn to read the option
           the instruction names, from either start.
           Where the mean reward comes from: the bonus run's last GiGPO checkpoint, sampled at
           temperature 0.4 (verl-agent's WebShop validation) on 128 validation
           instructions (`python -m rollx.eval --config=configs/webshop.py
           --checkpoint=<output_dir>/checkpoints --episodes=128
           --config.actor_infer.val_generating_args.temperature=0.4`), searches the
           instruction, opens the first result and buys at once on 123 of its 124 item
           pages: mean 0.360, no success (the twice-the-instructions run's: 124 of 126,
           mean 0.382, no success). The start, so sampled: 56 option clicks and 56
           Buy Now among 283 item-page actions, mean 0.184, one success. RL dropped the
           option clicks the start made at random (15 of its 56 of the right value); without
           them a purchase cannot score 1. The start can learn the choice: trained
           supervised on the oracle's answers (a diagnostic; a start carrying the task
           does not ship) for 150 steps (9 min), it chose the right option on 52 of 81
           clicks and succeeded on 13 of 64 (greedy). An hour of RL samples ~2,000
           episodes, and the few right option clicks in them lose to Buy Now first.

Each env step is one sample: the instruction and the current page (the instruction is
on every page and the item page shows the options chosen, so a history-free prompt
loses nothing a policy needs). GiGPO (Feng et al. 2025) compares steps taken on the
same page across a group's episodes, as in its WebShop results. Validation
instructions come from products no training instruction names (split="validation").
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
  # the tool model, the shop's words added to its vocabulary (a word copied is one token),
  # warm started on random-valid-action WebShop pages (no reward, no task signal),
  # shipped: its copy pretraining lets a click carry a product id off the page
  # (rollx.recipes.webshop_start, which rebuilds it in ~31-75 min)
  config.pretrain = models.DEFAULT_WEBSHOP_MODEL_DIR
  config.warm_start_steps = 0
  # frozenlake's 5e-4 raised the validation score by step 10 on this start, then lost it
  config.actor_train.training_args.learning_rate = 2e-4
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
      # an invalid action costs one of the 8 actions, no reward, as in the original
      # WebShop (a no-op). With any penalty (-0.1, -0.01 measured) the first updates
      # turned away from invalid clicks, i.e. miscopied product ids, by clicking no
      # product: purchases stopped within 3-5 steps and nothing was learnt
      format_penalty=0.0,
      # WebShop's original files (None: the synthetic catalog; here so that a flag can
      # set them, see the command above)
      data_dir=config_dict.placeholder(str),
      human_goals=False)
  config.custom_envs = {}
  config.custom_envs.WebShop = rollx_config.env_entry(
      # success_bonus / option_bonus / option_click_bonus: shapings of the training env's
      # reward only (0 = WebShop's reward); here so that a flag can set them
      "WebShop", env_config=dict(env_config, split="train", success_bonus=0.0,
                                 option_bonus=0.0, option_click_bonus=0.0),
      max_tokens_per_step=48,  # a search of up to the whole instruction (<= 44 tokens)
      **prompts.COMPACT_PROMPTS["WebShop"])
  config.custom_envs.WebShopVal = rollx_config.env_entry(
      "WebShop", env_config=dict(env_config, split="validation"),
      max_tokens_per_step=48, **prompts.COMPACT_PROMPTS["WebShop"])
  return config
