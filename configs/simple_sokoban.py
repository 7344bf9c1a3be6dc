"""SimpleSokoban (6x6, 1 box), GiGPO on step-wise samples: FrozenLake's recipe on Sokoban.

Command:   python -m rollx.train --config=configs/simple_sokoban.py
           curve: python -m rollx.curve --config=configs/simple_sokoban.py --minutes=60 --seed=1
Hardware:  one CPU host; 2 cores are enough, no accelerator needed.
Runtime:   ~9-12 s per step on 2 CPU cores (train ~3.9 s, rollout ~3.2 s, log-probs ~1.6 s);
           ~400 steps in 60 minutes.
Expected:  (2026-11-26, 84ab0aa) seed 1, 60 min: 0.043 over steps 0-90 -> 0.202 over 300-390
           (2026-11-27, cc94060) seed 2, 60 min: 0.062 over steps 0-90 -> 0.252 over 300-390
           mean greedy validation on 128 unseen levels, where random valid moves solve 0.156;
           the records: docs/results.md#simple-sokoban-seed1, docs/results.md#simple-sokoban-seed2

Everything but the env and the estimator is configs/frozenlake.py (history-free step
samples credited with the episode's group-centred score, whitening, KL loss to the warm
start, the per-update trust region, dynamic sampling). Sokoban is Markov in its board, so
a history-free sample loses nothing. The score is the env's shaped one (-0.1 per move, +1
box on a target, -1 off, +10 solved); validation success = solved. The default model was
warm started on SimpleSokoban's compact prompts with the neighbour line, as whole
conversations of random valid moves (rollx.recipes.warm_start). What was measured without
GiGPO or the line: docs/frozenlake_recipe.md, SimpleSokoban.
"""

import os

from envs import sokoban
from rollx import config as rollx_config
from rollx.rollout import prompts


def get_config():
  config = rollx_config.load_file(
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "frozenlake.py"))
  config.exp_name = "simple_sokoban_gigpo"
  config.max_steps = 400
  # a sample: instructions + 6x6 board + neighbour line (~100 tokens) + a 4-token answer
  config.sequence_length = 320  # packed row: 3 step samples
  # GiGPO: a step-level advantage among samples on the same board tells moves apart
  config.adv_estimator = "gigpo"
  config.gigpo_omega = 1.0  # weight of the step-level advantage
  config.actor_infer.strategy_args.max_prefill_length = 128
  config.actor_infer.strategy_args.max_cache_length = 160

  for manager in (config.train_env_manager, config.val_env_manager):
    manager.tags = ("SimpleSokoban",)
  config.custom_envs = {}  # FrozenLake's entry would be validated (and started) too
  config.custom_envs.SimpleSokoban = rollx_config.env_entry(
      "Sokoban",
      # show_neighbours: per move the tile next to P and the one beyond (a push needs both)
      env_config=dict(sokoban.VARIANTS["SimpleSokoban"], show_neighbours=True),
      max_tokens_per_step=8, **prompts.COMPACT_PROMPTS["Sokoban"])
  return config
