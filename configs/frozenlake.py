"""FrozenLake 4x4 (not slippery): GRPO on history-free step samples, the built-in default model.

Command:   python -m rollx.train --config=configs/frozenlake.py   (or `make train`)
           curve: python -m rollx.curve --config=configs/frozenlake.py --minutes=30 --seed=1
           GAE: --config.adv_estimator=gae --config.drop_zero_advantage_samples=False
           --config.episode_reward_gamma=1.0; async rollouts: --config.async_generation_ratio=1
           ROLL's layout: python -m rollx.train --config=configs/frozenlake.py:multiturn
Hardware:  one CPU host; 2 cores are enough, no accelerator needed.
Runtime:   ~2.0 s per step on a quiet 2-core host, ~4.4 s with GAE (2026-11-26), ~5-7 s on a
           shared one (2026-11-27); 200 steps by default, validation every 10.
           `:multiturn`: ~10.8 s per step (2026-11-27).
Expected:  (2026-11-27) GRPO seed 1, 30 min: first >= 0.8 at step 180, mean 0.925 over min 20-30
           (2026-11-26, 84ab0aa) seeds 1-3 on a quiet host: first >= 0.8 at 7.4 / 6.4 / 6.5 min
           (2026-11-26, 22145cf) GAE seed 1: first >= 0.8 at 11.8 min, lowest after it 0.719
           (2026-11-27, 8a1dad4) async, seed 1: first >= 0.8 at step 200, at 33.3 min (sync 43.5)
           (2026-11-27) `:multiturn` seed 1, 30 min: best 0.281, no takeoff in 167 steps
           greedy, on 128 unseen maps; the records: docs/results.md#frozenlake-grpo-seed1 on

Default (''): every env step is one sample whose prompt is the current grid and a line
naming the tile next to P in each direction; GRPO credits every step with its episode's
discounted score, centred within its group of 8 episodes on one map (StarPO's
trajectory-level credit, on a history-free policy). Training maps are random; validation
maps come from a disjoint seed stream, so validation measures generalisation.

`:multiturn`: ROLL's layout, one sample per episode: the whole conversation (a 10-turn
episode is 449 tokens), GRPO on the episode's score; each turn prefills only its new grid
onto the conversation's cached keys/values.

Why each setting, with measurements: docs/frozenlake_recipe.md.
"""

from rollx import config as rollx_config
from rollx.rollout import prompts


def get_config(layout: str = ""):
  if layout not in ("", "multiturn"):
    raise ValueError(f"configs/frozenlake.py takes '' or ':multiturn', got {layout!r}")
  config = rollx_config.default_config()
  config.exp_name = "frozenlake_grpo"
  config.seed = 42
  config.max_steps = 200  # global steps
  config.save_steps = 50
  config.logging_steps = 10
  config.eval_steps = 10
  config.rollout_batch_size = 128  # 16 groups x 8 episodes
  config.val_batch_size = 128  # 128 unseen maps, greedy: +-0.04 binomial noise at 0.7
  config.sequence_length = 176  # packed training row width: 4 step samples of ~44 tokens

  config.adv_estimator = "grpo"  # group-normalised episode scores
  # centred, not divided by the group's std: a lone -0.01 format penalty stays small
  config.reward_normalization.method = "mean"
  config.whiten_advantages = True  # one scale per batch; shared format tokens get no net push
  config.episode_reward_gamma = 0.9  # score = sum_t 0.9^t r_t: wasted moves lose credit
  config.drop_zero_advantage_samples = True  # all-alike groups have no gradient: skip them
  # dynamic sampling: play up to 4 batches until 8 groups carry a gradient
  config.min_informative_groups = 8
  config.max_rollout_rounds = 4
  config.ppo_epochs = 1
  config.pg_clip = 0.2
  config.init_kl_coef = 0.0  # no KL-in-reward ...
  config.use_kl_loss = True  # ... but a KL loss to the warm-start policy, for stability
  config.kl_loss_coef = 0.05  # weak enough that the greedy move sharpens (0.2 kept ~1 nat)
  config.entropy_loss_coef = 0.0  # the KL loss to the (uniform) warm start keeps it exploring

  # trust region: each update scaled back to this approx. KL from the rollout policy
  config.max_update_kl = 0.01
  config.actor_train.training_args.learning_rate = 5e-4  # 1e-3 swung validation after takeoff
  config.actor_train.training_args.warmup_steps = 2  # global steps: ~10 updates at ~4 a step
  config.actor_train.training_args.lr_scheduler_type = "constant"
  # minibatch = 64 packed rows of 176 tokens: ~4 updates per step; faster per token on CPU
  config.actor_train.training_args.per_device_train_batch_size = 64
  # "L2 init": decay towards the warm start keeps the policy able to learn the hole check
  config.actor_train.training_args.weight_decay = 2.0
  config.actor_train.training_args.weight_decay_target = "init"
  config.actor_train.model_args.disable_gradient_checkpointing = True  # 0.7M params: no remat
  # history-free prompts (40 tokens) + an 8-token answer: small prefill bucket and cache
  config.actor_infer.strategy_args.max_prefill_length = 64
  config.actor_infer.strategy_args.max_cache_length = 72
  # Only with --config.adv_estimator=gae --config.drop_zero_advantage_samples=False
  # --config.episode_reward_gamma=1.0: a critic (value head on a copy of the policy).
  config.lambd = 0.95  # per token (~0.81 per 4-token move): a fatal move takes most blame
  config.critic.training_args.learning_rate = 1e-3
  config.critic.training_args.per_device_train_batch_size = 64
  config.critic.model_args.disable_gradient_checkpointing = True
  config.actor_infer.generating_args.max_new_tokens = 8  # "<answer>Right</answer>"
  config.actor_infer.generating_args.temperature = 1.0
  config.actor_infer.generating_args.top_p = 1.0

  for manager in (config.train_env_manager, config.val_env_manager):
    manager.env_manager_type = "step"  # one sample per env step ...
    manager.history_length = 0  # ... whose prompt is the current grid only
    manager.tags = ("FrozenLake",)
  config.train_env_manager.num_env_groups = 16
  config.train_env_manager.group_size = 8  # 8 episodes share one map
  config.train_env_manager.max_env_num_per_worker = 128
  config.val_env_manager.num_env_groups = 128
  config.val_env_manager.group_size = 1
  config.val_env_manager.max_env_num_per_worker = 128

  config.custom_envs.FrozenLake = rollx_config.env_entry(
      "FrozenLake",
      # show_neighbours: the grid, then "Left _ Down O Right _ Up #" (the tiles next to P);
      # ineffective_action_ends_episode off: ending on a wall move trained worse
      env_config=dict(size=4, p=0.8, is_slippery=False, max_steps=10, show_neighbours=True,
                      ineffective_action_ends_episode=False),
      max_tokens_per_step=8,  # "<answer>Right</answer><|im_end|>" is 4 tokens
      **prompts.COMPACT_PROMPTS["FrozenLake"])  # no system text: a sample is the grid alone

  if layout == "multiturn":
    # ROLL's layout (StarPO): one sample per episode, the whole conversation, each turn
    # the new grid after the model's earlier answers; GRPO on the episode's score.
    config.exp_name = "frozenlake_multiturn_grpo"
    for manager in (config.train_env_manager, config.val_env_manager):
      manager.env_manager_type = "trajectory"
    config.episode_reward_gamma = 1.0  # a discount over steps needs step samples
    config.sequence_length = 512  # a 10-turn conversation: 449 tokens
    # every turn prefills only its new grid onto the conversation's cached keys/values
    # (reuse_kv, the default); the cache must hold the last turn
    config.actor_infer.strategy_args.max_prefill_length = 512
    config.actor_infer.strategy_args.max_cache_length = 512
    # a conversation's keys/values live in its slot between turns: one slot for each of
    # the 128 conversations in flight (with 64, half of every turn's prompts lost their
    # cache to another conversation and were prefilled whole)
    config.actor_infer.strategy_args.max_concurrent_decodes = 128
  return config
