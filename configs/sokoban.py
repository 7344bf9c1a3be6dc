"""Sokoban, ROLL's three variants side by side: SimpleSokoban (6x6, 1 box),
LargerSokoban (10x10, 2 boxes) and SokobanDifferentGridVocab (6x6, other symbols).

Command:   python -m rollx.train --config=configs/sokoban.py
           ROLL's whole conversations with GRPO instead (slow on a CPU, below):
           python -m rollx.train --config=configs/sokoban.py:multiturn
Hardware:  one CPU host (2 cores) for the default model (step-wise); a GPU/TPU host for
           `:multiturn` or Qwen2.5-0.5B (--config.pretrain=/path/to/Qwen2.5-0.5B-Instruct).
Runtime:   session 30, 2 CPU cores, a 3-step run (--config.max_steps=3): 131 s in all,
           steps of 61 / 32 / 24 s (first-step compiles; step 3: rollout 7.4 s,
           log-probs 5.1, train 11.3); longer runs not measured.
Expected:  not shown to learn: 30 min, seed 1 (session 30, ~35 s per step, 50 steps):
           greedy validation 0.078 -> 0.023-0.063, flat (invalid answers ~1%, no
           episode out of context). The same recipe on SimpleSokoban alone rises over 60 min on 2
           CPU cores (configs/simple_sokoban.py: greedy validation 0.04 -> 0.20, session
           29); RAGEN reports ~0.2 for Qwen2.5-0.5B. The default model was format-warm
           started on SimpleSokoban's compact prompts with the neighbour line only
           (rollx.models.warm_start): the 10x10 boards and the other symbols are new to it.

Default (''): configs/simple_sokoban.py's recipe (history-free step samples, GiGPO, the
neighbour line; FrozenLake's recipe otherwise) on the three variants. Step samples keep
every sample one board long, so the 10x10 level's 20 moves cost 20 short samples.

`:multiturn`: ROLL's layout, one sample per episode (every turn repeats the board), GRPO
on the episode's score. A LargerSokoban episode of 20 turns with 8-token answers is 2,914
tokens with the default tokenizer (a 6x6 one of 10 turns 794, 863 with the other
symbols), and each turn's whole context is one prefill, so the server's prefill and
cache lengths must hold the last turn's. Until session 30 this config was multi-turn
with 1024 / 512 tokens, which cut the 10x10 episodes after 3 turns and the 6x6 ones
after 6 (tests/test_config.py checks that a full-length episode fits). On the 2-core,
24 GB CPU host the server then ran out of memory before the first step (20.5 GB,
session 30); with attention in query blocks and 8-row microbatches (session 31) a step
runs in ~21 min at 10.1 GB in all (server 6.8 GB, trainer 3.3 GB; step 1, eval off:
rollout 952 s over 2 rounds, log-probs 100 s, train 191 s; no episode out of context,
invalid answers 27% on the 10x10 levels, whose long conversations the default model
was never warm started on, 0.5% on the 6x6 ones).
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
  # the instructions + a 10x10 board + the neighbour line (~170 tokens) + an 8-token
  # answer
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
    for role in (config.actor_train, config.critic):
      # the same 64-row minibatch in microbatches of 8 rows: one update of 64 rows x
      # 3072 tokens needed 18.9 GB of XLA temp buffers, microbatches of 8 need 2.3 GB
      role.training_args.per_device_train_batch_size = 8
      role.training_args.gradient_accumulation_steps = 8
  return config
