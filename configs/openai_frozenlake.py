"""FrozenLake played by a plain OpenAI-SDK agent loop (examples/openai_frozenlake.py):
one conversation per episode, GRPO on its score; the model and env of
configs/frozenlake.py.

Command:   python -m rollx.train --config=configs/openai_frozenlake.py
Hardware:  one CPU host; 2 cores are enough, no accelerator needed.
Runtime:   not measured for a learning run; a 1-step run trains (see the README).
Expected:  not measured yet: no record of this config in docs/results.md. The recipe that
           learns FrozenLake from the default model: docs/results.md#frozenlake-grpo-seed1

configs/frozenlake.py learns from history-free step samples; this one is the same game as
a user's agent program writes it, whole conversations, which the default model was never
warm started on.
"""

import os

from rollx import config as rollx_config


def get_config():
  config = rollx_config.load_file(
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "frozenlake.py"))
  config.exp_name = "openai_frozenlake_grpo"
  config.rollout_batch_size = 64  # 8 groups x 8 conversations on one map
  config.val_batch_size = 64
  config.episode_reward_gamma = 1.0  # the score of a whole conversation (no per-step discount)
  config.sequence_length = 512  # 10 turns of a ~35-token board and a 4-token move
  config.actor_infer.strategy_args.max_prefill_length = 512
  config.actor_infer.strategy_args.max_cache_length = 512
  for manager in (config.train_env_manager, config.val_env_manager):
    manager.env_manager_type = "trajectory"  # one sample per conversation
    manager.history_length = 2
  config.train_env_manager.num_env_groups = 8
  config.val_env_manager.num_env_groups = 64
  config.custom_envs.FrozenLake.agent_loop = "program"  # the OpenAI-SDK loop, one per episode
  config.custom_envs.FrozenLake.agent_program = "examples.openai_frozenlake:play"
  return config
