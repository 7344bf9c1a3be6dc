"""Sokoban, ROLL's three variants side by side: SimpleSokoban (6x6, 1 box),
LargerSokoban (10x10, 2 boxes) and SokobanDifferentGridVocab (6x6, other symbols).

Command:   python -m rollx.train --config=configs/sokoban.py
           ROLL's whole conversations with GRPO instead (slow on a CPU, below):
           python -m rollx.train --config=configs/sokoban.py:multiturn
Hardware:  one CPU host (2 cores) for the default model (step-wise); a GPU/TPU host for
           `:multiturn` or Qwen2.5-0.5B (--config.pretrain=/path/to/Qwen2.5-0.5B-Instruct).
Runtime:   ~35 s per step step-wise on 2 CPU cores (2026-11-26); `:multiturn` 4.7 min for
           its first step, compiles included, 6.3 GiB peak memory in all (2026-11-27).
Expected:  (2026-11-26, 2eb9ae9) seed 1, 30 min: not shown to learn, 0.078 -> 0.023-0.063
           (2026-11-27) `:multiturn`, one step: ~100 prompt tokens prefilled a turn, ~750 reused
           (2026-11-26, 8a7691a) `:multiturn`: 27% of the 10x10 answers invalid, 0.5% of 6x6
           greedy validation on 128 levels of the three variants; the records:
           docs/results.md#sokoban-seed1, docs/results.md#sokoban-multiturn-step and
           docs/results.md#sokoban-multiturn-step-before-kv-reuse

Default (''): configs/simple_sokoban.py's recipe (history-free step samples, GiGPO, the
neighbour line) on the three variants, so a 10x10 level's 20 moves are 20 short samples.
The same recipe on SimpleSokoban alone rises slowly over 60 min (configs/simple_sokoban.py);
RAGEN reports ~0.2 for Qwen2.5-0.5B on Sokoban. The default model was warm started on
SimpleSokoban's compact prompts with the neighbour line only (rollx.recipes.warm_start):
10x10 boards and other symbols are new to it.

`:multiturn`: ROLL's layout, one sample per episode with GRPO on its score; a 20-turn
10x10 episode is 2,914 tokens, and the server's prefill and cache lengths must hold its
last turn (tests/test_config.py checks that a full-length episode of every shipped config
fits).
"""

import os

from envs import sokoban
from rollx import config as rollx_config
from rollx.rollout import prompts


def get_config(layout: str = ""):
  if layout not in ("", "multiturn"):
    raise ValueError(f"configs/sokoban.py takes '' or ':multiturn', got {layout!r}")
  config = rollx_config.load_file(
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "simple_sokoban.py"))
  config.exp_name = "sokoban_gigpo"
  # a sample: instructions + 10x10 board + neighbour line (~170 tokens) + an 8-token answer
  config.sequence_length = 512  # packed row: 2-4 step samples
  config.actor_infer.strategy_args.max_prefill_length = 256
  config.actor_infer.strategy_args.max_cache_length = 256

  config.train_env_manager.tags = ("SimpleSokoban", "LargerSokoban",
                                   "SokobanDifferentGridVocab")
  config.train_env_manager.num_groups_partition = (8, 4, 4)  # favour the 6x6 levels
  config.val_env_manager.tags = config.train_env_manager.tags  # 128 levels: ~43 each
  config.custom_envs = {}
  for variant, env_config in sokoban.VARIANTS.items():
    text = dict(prompts.COMPACT_PROMPTS["Sokoban"])
    if "grid_lookup" in env_config:  # other symbols: keep the env's own legend
      del text["instructions"]
    # the neighbour line, as the default model was warm started on SimpleSokoban
    config.custom_envs[variant] = rollx_config.env_entry(
        "Sokoban", env_config=dict(env_config, show_neighbours=True),
        max_tokens_per_step=8, **text)

  if layout == "multiturn":
    config.exp_name = "sokoban_multiturn_grpo"
    for manager in (config.train_env_manager, config.val_env_manager):
      manager.env_manager_type = "trajectory"  # one sample per episode
    config.adv_estimator = "grpo"
    config.episode_reward_gamma = 1.0  # a discount over steps needs step samples
    config.sequence_length = 3072  # a 20-turn 10x10 episode: 2,914 tokens
    config.actor_infer.strategy_args.max_prefill_length = 4096  # a bucket >= 2,914
    config.actor_infer.strategy_args.max_cache_length = 4096  # >= max_prefill_length
    # a conversation's keys/values live in its slot between turns: a slot for each of
    # the 128 conversations in flight, or half of every turn's prompts are prefilled whole
    config.actor_infer.strategy_args.max_concurrent_decodes = 128
    for role in (config.actor_train, config.critic):
      # the same 64-row minibatch in 8-row microbatches: 2.3 GB of XLA temp, not 18.9 GB
      role.training_args.per_device_train_batch_size = 8
      role.training_args.gradient_accumulation_steps = 8
  return config
