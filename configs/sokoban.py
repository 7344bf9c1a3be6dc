"""Sokoban, ROLL's three variants side by side: SimpleSokoban (6x6, 1 box),
LargerSokoban (10x10, 2 boxes) and SokobanDifferentGridVocab (6x6, other symbols).

Command:   python -m rollx.train --config=configs/sokoban.py
           (one variant only: --config.train_env_manager.tags="('SimpleSokoban',)"
            --config.train_env_manager.num_groups_partition="(16,)")
Hardware:  one CPU host (2 cores) for the default model; a GPU/TPU host for
           Qwen2.5-0.5B (--config.pretrain=/path/to/Qwen2.5-0.5B-Instruct).
Runtime:   not measured yet for this config (see the README table for FrozenLake's
           seconds per step on 2 CPU cores).
Expected:  the target is a SimpleSokoban success curve that rises over 60 min on 2 CPU
           cores (no threshold yet); RAGEN reports ~0.2 for Qwen2.5-0.5B. Not shown yet
           (see the README's learning section; configs/simple_sokoban.py is the
           config that rose). The default model is format-warm-started on
           SimpleSokoban's compact prompts with the neighbour line
           (rollx.models.warm_start), which this config shows on every variant.
"""

from envs import sokoban
from rollx import config as rollx_config
from rollx.rollout import prompts


def get_config():
  config = rollx_config.default_config()
  config.exp_name = "sokoban_grpo"
  config.max_steps = 300
  config.rollout_batch_size = 128  # 16 groups x 8 episodes
  config.val_batch_size = 48
  config.sequence_length = 1024  # up to 20 turns of a 10x10 grid

  config.adv_estimator = "grpo"
  config.use_kl_loss = True
  config.kl_loss_coef = 0.01
  config.entropy_loss_coef = 0.001

  config.actor_train.training_args.learning_rate = 3e-4
  config.actor_infer.generating_args.max_new_tokens = 8

  config.train_env_manager.num_env_groups = 16
  config.train_env_manager.group_size = 8
  config.train_env_manager.tags = ("SimpleSokoban", "LargerSokoban",
                                   "SokobanDifferentGridVocab")
  config.train_env_manager.num_groups_partition = (8, 4, 4)  # favour the 6x6 levels
  config.val_env_manager.num_env_groups = 48
  config.val_env_manager.group_size = 1
  config.val_env_manager.tags = config.train_env_manager.tags  # equal split: 16 each

  for variant, env_config in sokoban.VARIANTS.items():
    text = dict(prompts.COMPACT_PROMPTS["Sokoban"])
    if "grid_lookup" in env_config:  # other symbols: keep the env's own legend
      del text["instructions"]
    # the neighbour line, as the default model was warm started on SimpleSokoban
    config.custom_envs[variant] = rollx_config.env_entry(
        "Sokoban", env_config=dict(env_config, show_neighbours=True),
        max_tokens_per_step=8, **text)
  return config
