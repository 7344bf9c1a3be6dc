"""Tool use on verifiable arithmetic: the model may call a calculator before it answers;
GRPO on whole conversations.

Command:   python -m rollx.train --config=configs/tool_arithmetic.py
           curve: python -m rollx.curve --config=configs/tool_arithmetic.py --minutes=60 --seed=1
           without tools (the same tasks, the model alone):
           --config.custom_envs.Arithmetic.agent_loop=game --config.custom_envs.Arithmetic.tools="()"
           (and the same for ArithmeticVal)
           play it: python -m rollx.play --config=configs/tool_arithmetic.py --env=Arithmetic
           --policy=human
           the start (shipped as rollx/models/default_tools): python -m rollx.recipes.tool_start
Hardware:  one CPU host; 2 cores are enough, no accelerator needed.
Runtime:   ~4.3 steps a minute on 2 CPU cores (2026-11-28); the start's rebuild ~30 min.
Expected:  (2026-11-28) seed 1, 60 min: 0.266 at the start, mean 0.445 over the last 30 min
           (2026-11-28) seed 2, 60 min: 0.219 at the start, mean 0.442 over the last 30 min
           (2026-11-28) tools off, seeds 1 and 2: 0.000 at every evaluation (no answer written)
           greedy validation success on 64 unseen problems; the records:
           docs/results.md#tool-arithmetic-seed1, docs/results.md#tool-arithmetic-seed2 and
           docs/results.md#tool-arithmetic-tools-off

Tasks are reasoning-gym's `basic_arithmetic` with 3-4 terms of 3-4 digits: exact answers
a small model cannot compute in its head, and a calculator call away. Training and
validation problems come from disjoint generator seeds. The default model has never seen
a tool call, so the run starts from the tool start: the default model copy pretrained,
then warm started on solved calculator demonstrations of other task families (chain sums
and products), so any gain on `basic_arithmetic` is RL's. A real run starts from an
instruct model that calls tools (--config.pretrain=/path/to/Qwen2.5-0.5B-Instruct).
How the start is built and why each setting, with what was tried:
docs/tool_arithmetic_recipe.md.
"""

from rollx import config as rollx_config
from rollx import models


def get_config():
  config = rollx_config.default_config()
  config.exp_name = "tool_arithmetic_grpo"
  config.seed = 42
  config.max_steps = 200
  config.save_steps = 50
  config.logging_steps = 10
  config.eval_steps = 10
  config.rollout_batch_size = 32  # 4 groups x 8 conversations on one problem each
  config.val_batch_size = 64  # 64 unseen problems, greedy
  config.sequence_length = 1024  # system + tool list (~400 tokens), the problem, calls and results

  # the default model warm started on calculator demonstrations of chain sums and products
  # (not basic_arithmetic), after copy pretraining, shipped: `python -m rollx.recipes.tool_start`
  # rebuilds it (1,600 copy steps, 200 warm-start steps, ~30 min); from the bare default model
  # instead (the warm start alone, no copy pretraining):
  # --config.pretrain="" --config.warm_start_steps=200
  config.pretrain = models.DEFAULT_TOOLS_MODEL_DIR
  config.warm_start_steps = 0
  config.adv_estimator = "grpo"  # group-normalised scores of whole conversations
  config.reward_normalization.method = "mean"  # centred: a lone success keeps its scale
  config.whiten_advantages = True
  config.drop_zero_advantage_samples = True  # all-alike groups have no gradient
  config.use_kl_loss = True  # a KL loss to the starting policy, for stability
  config.kl_loss_coef = 0.05
  config.max_update_kl = 0.01  # per-update trust region, as the grid-game recipes
  # 5e-4 moved the greedy policy by +-0.15 between evaluations and learnt nothing in 30 min
  config.actor_train.training_args.learning_rate = 1e-4
  config.actor_train.training_args.per_device_train_batch_size = 16
  config.actor_train.model_args.disable_gradient_checkpointing = True  # 0.7M params: no remat
  config.actor_infer.strategy_args.max_prefill_length = 1024
  config.actor_infer.strategy_args.max_cache_length = 1024
  config.actor_infer.generating_args.max_new_tokens = 96
  # validation's own cap (64 by default) would cut a calculator call mid-expression: the
  # call's fixed JSON alone is ~58 tokens
  config.actor_infer.val_generating_args.max_new_tokens = 96

  for manager in (config.train_env_manager, config.val_env_manager):
    manager.env_manager_type = "trajectory"  # one sample per conversation (tool results: mask 0)
  config.train_env_manager.tags = ("Arithmetic",)
  config.val_env_manager.tags = ("ArithmeticVal",)
  config.train_env_manager.num_env_groups = 4
  config.train_env_manager.group_size = 8
  config.val_env_manager.num_env_groups = 64
  config.val_env_manager.group_size = 1

  params = ('{"basic_arithmetic": {"min_terms": 3, "max_terms": 4, "min_digits": 3, '
            '"max_digits": 4}}')
  # the calculator alone: the Python tool's schema would double the ~400-token prompt the
  # default model copies the problem after (add it: tools=("calculator", "python"))
  tools = dict(agent_loop="tool", tools=("calculator",),
               max_turns=4,  # three rounds of tool calls, then an answer
               max_tool_response_length=128,
               max_tokens_per_step=96,  # one call or one answer
               system_prompt="You can use tools.")
  for tag, split in (("Arithmetic", "train"), ("ArithmeticVal", "validation")):
    config.custom_envs[tag] = rollx_config.env_entry(
        "ReasoningTask", env_config=dict(datasets=("basic_arithmetic",),
                                         dataset_params=params, split=split), **tools)
  return config
