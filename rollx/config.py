"""Every config key with its default, and the names the config's checks share.

A config file (`configs/*.py`) starts from `default_config()`, changes what its
experiment needs, and adds its envs with `env_entry`. rollx.checks.validate then checks
the whole tree once, against these defaults and each area's rules.

Optional keys (None = unset) are ml_collections placeholders so that command-line
overrides such as `--config.pretrain=/path/to/hf_dir` know their type. This module sits
below everything that reads a config and imports none of it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, List, Optional, Tuple

import ml_collections
from ml_collections import config_dict

from rollx.errors import ConfigError  # noqa: F401  (re-exported: config.ConfigError)

ADV_ESTIMATORS = ("gae", "grpo", "reinforce", "gigpo")
DTYPES = ("bf16", "fp32", "fp16")
ATTN_IMPLEMENTATIONS = ("xla",)
LR_SCHEDULERS = ("constant", "linear", "cosine")
WEIGHT_DECAY_TARGETS = ("zero", "init")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")  # rollx.algos.losses.kl_divergence
NORM_GROUPINGS = ("traj_group_id", "tags", "batch")
NORM_METHODS = ("mean_std", "mean", "identity")
WORKER_ROLES = ("actor_train", "actor_infer", "critic", "reference")
# the projections a LoRA adapter can target (rollx.models.lora), in layer order
LORA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# What each role is: its model's head and what runs it. One value per role (the
# keys exist so a config reads like ROLL's; another value is a named error).
ROLE_MODEL_TYPES = {"actor_train": "causal_lm", "actor_infer": "causal_lm",
                    "reference": "causal_lm", "critic": "value"}
ROLE_STRATEGIES = {"actor_train": "jax", "actor_infer": "jetstream", "reference": "jax",
                   "critic": "jax"}
_SERVER_KEYS = ("max_concurrent_decodes", "max_prefill_length", "max_cache_length",
                "num_servers", "detokenize_depth", "max_restarts", "restart_timeout_s",
                "reuse_kv", "keep_prefix_across_updates", "prefix_cache_tokens")
# Keys of a role's block that the role never reads: setting one to anything but its
# default is an error naming the key (a setting that silently did nothing would mislead).
INERT_KEYS = {
    **{f"{role}.generating_args": f"{role} does not sample (the servers' sampling is "
       "actor_infer.generating_args)" for role in ("actor_train", "critic", "reference")},
    **{f"{role}.strategy_args.{key}": "a rollout-server setting (actor_infer.strategy_args)"
       for role in ("actor_train", "critic", "reference") for key in _SERVER_KEYS},
    "reference.training_args": "the reference policy is frozen",
    "reference.model_args.disable_gradient_checkpointing": "the reference takes no gradients",
    "actor_infer.training_args": "the rollout servers do not train",
    "actor_infer.model_args.disable_gradient_checkpointing": "the servers take no gradients",
    "actor_infer.strategy_args.dp_size": "server replicas are separate servers (num_servers)",
    "actor_infer.strategy_args.num_microbatches": "a server runs no pipeline stages",
    "reference.model_args.lora": "the reference is the frozen policy (with actor_train's "
                                 "adapters: its base)",
    "actor_infer.model_args.lora": "the servers serve actor_train's adapters, synced",
    "critic.model_args.lora": "the critic trains in full (its value head is new)",
}
ENV_MANAGERS = ("train_env_manager", "val_env_manager")
ENV_MANAGER_TYPES = ("trajectory", "step")

# Keys whose value may take one of several types (checked instead of the default's).
UNION_TYPES = {"resume_from_checkpoint": (str, bool),
               **{f"{role}.model_args.lora.target_modules": (tuple, str)
                  for role in WORKER_ROLES}}


def _cd(**fields) -> ml_collections.ConfigDict:
  # type_safe=False: type checks belong to rollx.checks.validate, which names the key;
  # a type-safe ConfigDict would raise from inside the user's config file instead.
  return ml_collections.ConfigDict(fields, type_safe=False)


def _worker(role: str, *, learning_rate: float, **extra) -> ml_collections.ConfigDict:
  """One worker role's block, the same shape for actor_train/infer, critic, reference."""
  return _cd(
      model_args=_cd(
          model_type=ROLE_MODEL_TYPES[role],  # causal_lm (policy, reference) | value (critic)
          dtype="fp32",  # compute dtype (params stay fp32): bf16 | fp16 | fp32
          attn_implementation="xla",  # xla: the one implementation (query blocks below)
          # Query rows per attention block: a longer row's queries attend block by
          # block, so its scores are [block, S], not [T, S] (memory only; the math is
          # the same). 0: one dense softmax over the whole row.
          attention_block=512,
          disable_gradient_checkpointing=False,  # True: no remat (faster, more memory)
          # LoRA adapters (actor_train; rollx.models.lora): rank > 0 trains them on a
          # frozen base (no base gradients or optimizer state; the KL reference is the
          # base itself; weight syncs send the adapters alone). 0: full training.
          lora=_cd(
              rank=0,
              alpha=16.0,  # the adapters' scale is alpha / rank (alpha / sqrt(rank): rslora)
              # projection names, or a regex searched in `layers/<name>`; default: all
              target_modules=LORA_PROJECTIONS,
              rslora=False,
              # a PEFT adapter directory (rollx's export/adapter, or peft's) to start the
              # adapters from instead of zero; its rank, alpha, targets and rslora must be
              # the ones above, its base `pretrain`
              adapter_dir=config_dict.placeholder(str),
          ),
      ),
      training_args=_cd(
          learning_rate=learning_rate,
          per_device_train_batch_size=8,  # micro-batch per data-parallel shard
          gradient_accumulation_steps=1,
          weight_decay=0.0,  # decoupled (AdamW), matrices only
          weight_decay_target="zero",  # zero (AdamW) | init: towards the params at the start
          warmup_steps=0,  # global steps of linear warmup (schedules run over max_steps)
          lr_scheduler_type="constant",  # constant | linear | cosine: to 0 at max_steps
          max_grad_norm=1.0,  # global-norm clip; <= 0 disables
          adam_beta1=0.9,
          adam_beta2=0.999,
          adam_eps=1e-8,
      ),
      generating_args=_cd(
          max_new_tokens=64,  # per turn, together with the env's max_tokens_per_step
          temperature=1.0,  # 0 = greedy
          top_p=1.0,
          top_k=0,  # 0 = off
          num_return_sequences=1,  # 1: a group's responses come from group_size envs
      ),
      strategy_args=_cd(
          strategy_name=ROLE_STRATEGIES[role],  # jax (jit over a mesh) | jetstream (actor_infer)
          dp_size=-1,  # -1 = fill with the devices left over
          fsdp_size=1,
          tp_size=1,
          pp_size=1,
          num_microbatches=1,  # pipeline microbatches (pp_size > 1)
          max_concurrent_decodes=64,  # KV-cache slots per inference server
          max_prefill_length=512,  # longest prompt a server takes (a power of two >= 16)
          max_cache_length=1024,  # KV-cache length per slot: prompt + response
          num_servers=1,  # inference servers behind the rollout client
          # generate steps a server dispatches before it reads a step's tokens: 1 overlaps
          # the next step with the reads, 0 reads each step first (rollx.serving.batching)
          detokenize_depth=1,
          # A trajectory's next turn prefills only its new ids onto the keys/values its
          # previous turn left in the server (checked id by id; dropped when the weights
          # change or the slot is reused): rollx.serving.engine
          reuse_kv=True,
          # Off: a weight update drops the cached keys/values (exact: every token's keys/
          # values come from the weights that sample the next). On: they are kept, each
          # tagged with the version that computed it; the staleness lowers the response's
          # policy version and is logged (rollout/stale_reused_tokens_per_turn). Off: the
          # prefill it saves is small beside the drift it brings to on-policy log-probs.
          keep_prefix_across_updates=False,
          # Tokens of finished turns' keys/values a server keeps beside its slots (blocks
          # of 64, least recently used conversation evicted first): a conversation whose
          # slot was given to another request continues from there. 0: the slots alone
          # keep them, so a run needs a slot per conversation in flight for full reuse.
          prefix_cache_tokens=0,
          # A server that dies is restarted by Ray (this many times per server; -1 = no
          # limit) and gets the current weights before it serves; requests wait up to
          # restart_timeout_s for one to come back when none is alive.
          max_restarts=3,
          restart_timeout_s=300.0,
      ),
      device_mapping=config_dict.placeholder(tuple),  # device ids; None = all devices
      **extra,
  )


def _env_manager(*, num_env_groups: int, group_size: int) -> ml_collections.ConfigDict:
  return _cd(
      max_env_num_per_worker=16,  # envs hosted by one Ray env worker
      num_env_groups=num_env_groups,  # groups per generation
      group_size=group_size,  # envs per group; all share one level (seed)
      tags=("FrozenLake",),  # custom_envs entries the groups are drawn from
      num_groups_partition=config_dict.placeholder(tuple),  # groups per tag; None = equal
      env_manager_type="trajectory",  # trajectory (StarPO: one sample per episode) | step (GiGPO)
      history_length=2,  # step-wise prompts: how many past steps they show
      group_size_redundancy=0,  # extra envs per group; the first group_size episodes count
      group_filter_ratio=1.0,  # StarPO-S: keep this fraction of groups, by reward std
      # step-wise training: each step also trained as seen through these board symmetries
      # (envs.symmetry.TRANSFORMS, e.g. ("rot180",)); grid envs that list them only
      symmetric_views=(),
  )


def default_config() -> ml_collections.ConfigDict:
  """Every key rollx reads, with its default. Config files start from this."""
  return _cd(
      # -- experiment ----------------------------------------------------------
      exp_name="rollx",
      seed=42,
      logging_dir="./output/logs",  # TensorBoard event files
      output_dir="./output",  # checkpoints and exported models
      render_save_dir="./output/render",  # validation episode frames / GIFs
      # -- schedule ------------------------------------------------------------
      max_steps=100,  # global (pipeline) steps
      save_steps=50,  # checkpoint every N steps (and at the end)
      logging_steps=10,  # trajectory transcripts every N steps
      eval_steps=10,  # validation every N steps; 0 = never
      resume_from_checkpoint="",  # '' / False = fresh; 'true' = latest in output_dir; or a path
      # -- models --------------------------------------------------------------
      pretrain=config_dict.placeholder(str),  # local HF dir; None = built-in default model
      # > 0: steps learning a new env's format from random play (rollx.recipes.warm_start)
      warm_start_steps=0,
      # True: the warm start's loss on answers only, not spent on long pages (WebShop)
      warm_start_responses_only=False,
      # -- rewards -------------------------------------------------------------
      # a reward model: a local AutoModelForSequenceClassification directory (Qwen2 /
      # Llama, the policy's tokenizer) scoring each trajectory (rollx.rewards)
      reward_pretrain=config_dict.placeholder(str),
      reward_batch_size=8,  # trajectories the reward model scores at once
      # what the policy learns from, summed; env=0: the reward model alone
      reward_sources=_cd(env=1.0, reward_model=1.0),
      # -- rollout -------------------------------------------------------------
      rollout_batch_size=64,  # trajectories per training step (a multiple of group_size)
      val_batch_size=16,  # trajectories per validation
      sequence_length=1024,  # max tokens of one sample (prompt + all turns)
      async_generation_ratio=0.0,  # k > 0: async, k batches ahead, <= ceil(k) versions stale
      # -- algorithm -----------------------------------------------------------
      adv_estimator="grpo",  # gae | grpo | reinforce | gigpo
      ppo_epochs=1,
      gamma=1.0,
      lambd=1.0,  # GAE lambda
      pg_clip=0.2,  # PPO ratio clip
      pg_clip_low=config_dict.placeholder(float),  # asymmetric clip; None = pg_clip
      pg_clip_high=config_dict.placeholder(float),
      dual_clip_loss=False,
      dual_clip_ratio=3.0,  # dual-clip PPO's c (Ye et al. 2020): a negative A's loss <= -A c
      # Importance weights for tokens sampled by another policy than actor_train's
      # (async staleness, temperature, server numerics; rollx.algos.correction):
      # auto | none | tis | mis | seq_tis | decoupled. auto = tis when async or the
      # train temperature != 1, else none.
      rollout_correction="auto",
      rollout_correction_threshold=2.0,  # C: tis / seq_tis cap, mis band [1/C, C], decoupled cap
      value_clip=0.5,  # critic value clip; <= 0 disables
      init_kl_coef=0.0,  # KL-in-reward coefficient
      target_kl=config_dict.placeholder(float),  # adaptive KL controller target; None = fixed
      kl_horizon=10000,  # adaptive KL controller horizon
      use_kl_loss=False,  # KL as a loss term instead of a reward penalty
      kl_loss_coef=0.0,
      kl_loss_type="k3",  # KL loss estimator on sampled tokens: k1 | k2 | k3 (rollx.algos.losses)
      whiten_advantages=False,
      # The actor trains only on samples whose advantage is non-zero (grpo / gigpo /
      # reinforce: a group whose episodes all scored alike carries no policy gradient);
      # their log-prob and train compute is saved, whitening runs over the samples kept.
      drop_zero_advantage_samples=False,
      # With drop_zero_advantage_samples and token-mean (or seq-mean-token-mean,
      # which runs as token-mean over per-sample weights) aggregation: equal samples
      # (same tokens, same advantage sign; step-wise episodes of a group often walk the
      # same states) run the model once, weighted by their count. Exact (the same loss
      # and gradients, rollx.trainer.packing.merge_identical); saves log-prob and train
      # compute.
      merge_identical_samples=True,
      # Dynamic sampling (with drop_zero_advantage_samples): while fewer than this many
      # groups of the step carry a policy gradient, another rollout_batch_size of episodes
      # is played and added, up to max_rollout_rounds batches per step. Late in training
      # most groups all succeed, and the few left would make a noisy update. 0 = off;
      # inactive (a warning at start) without drop_zero_advantage_samples, so that a
      # config can switch that off (gae) without touching this.
      min_informative_groups=0,
      max_rollout_rounds=4,
      advantage_clip=config_dict.placeholder(float),  # |A| clip; None = off
      entropy_loss_coef=0.0,
      # Trust region per optimizer update: an actor update that would move the policy
      # past this approx KL from the rollout policy (token mean of 0.5 log-ratio^2 on its
      # minibatch, measured after the update) is scaled down to about it; a minibatch
      # that starts beyond it moves only if its update comes back inside. None = off.
      max_update_kl=config_dict.placeholder(float),
      critic_warmup=0,  # steps of critic-only training before the actor trains
      loss_agg_mode="token-mean",
      reward_normalization=_cd(
          grouping="traj_group_id",  # traj_group_id | tags | batch
          method="mean_std",  # mean_std | mean | identity
      ),
      step_reward_gamma=0.95,  # GiGPO step return discount
      # Discount per env step of the episode score that grpo / gigpo / reinforce
      # normalise: score = sum_t gamma^t r_t over the episode's steps (step-wise samples).
      # 1.0 = the plain sum (ROLL's score); < 1 scores a shorter success higher, so a
      # move that wastes a step (into a wall, back and forth) is not credited like the
      # moves that reach the goal.
      episode_reward_gamma=1.0,
      gigpo_omega=1.0,  # GiGPO weight of the step-level advantage
      # -- workers -------------------------------------------------------------
      actor_train=_worker("actor_train", learning_rate=1e-6, model_update_frequency=1),
      actor_infer=_worker(
          "actor_infer", learning_rate=0.0,
          val_generating_args=_cd(  # sampling of validation rollouts
              max_new_tokens=64, temperature=0.0, top_p=1.0, top_k=0, num_return_sequences=1)),
      critic=_worker("critic", learning_rate=1e-5),
      # a KL term's frozen initial policy: its own mesh (strategy_args, device_mapping)
      # and model_args; it shares actor_train's compiled pass when they are alike
      reference=_worker("reference", learning_rate=0.0),
      # -- envs ----------------------------------------------------------------
      train_env_manager=_env_manager(num_env_groups=8, group_size=8),
      val_env_manager=_env_manager(num_env_groups=16, group_size=1),
      custom_envs=_cd(),  # tag -> env_entry(...)
      # -- cluster (launch/) ---------------------------------------------------
      ray_address=config_dict.placeholder(str),  # None = start a local Ray; 'auto' / host:port = join
      ray_resources=_cd(  # custom resources (`ray start --resources`) that place actors; '' = any node
          env_worker="",  # env workers, e.g. 'rollx_env' (CPU hosts)
          server="",  # actor_infer JetStream servers, e.g. 'rollx_infer' (accelerator hosts)
      ),
  )


def env_entry(env_type: str, env_config: Optional[Dict[str, Any]] = None,
              max_tokens_per_step: int = 64, system_prompt: str = "",
              turn_template: str = "", instructions: str = "", agent_loop: str = "game",
              tools: Tuple[str, ...] = (), mcp_servers: Tuple[str, ...] = (),
              max_turns: int = 8,
              max_tool_response_length: int = 256,
              agent_program: str = "",
              python_sandbox: str = "bwrap") -> ml_collections.ConfigDict:
  """A `custom_envs` entry: which env class, its config, the per-turn token cap, and
  the prompt text ('' = ROLL's system prompt / turn template, rollx.rollout.prompts;
  the env's own `instructions`; system_prompt='none': no system message).

  `agent_loop` (rollx.rollout.agent_loops): 'game' (each response is an env action) or
  'tool' (the model calls `tools`, registered names of rollx.tools, between answers;
  at most `max_turns` responses; each tool result cut to `max_tool_response_length`
  tokens). `mcp_servers`: commands of local MCP servers (stdio) whose tools join.
  'program': `agent_program` ("package.module:function"), an async agent function of the
  user's, talks to the model through an OpenAI-compatible endpoint; `tools` and
  `mcp_servers` are offered to it. `python_sandbox`: how the `python` tool confines model
  code (rollx.tools.sandbox): 'bwrap' (namespaces, seccomp, limits; the run refuses to start
  where the host does not allow them) or 'process' (rlimits only, no isolation)."""
  return _cd(env_type=env_type, env_config=_cd(**(env_config or {})),
             max_tokens_per_step=max_tokens_per_step, system_prompt=system_prompt,
             turn_template=turn_template, instructions=instructions, agent_loop=agent_loop,
             tools=tuple(tools), mcp_servers=tuple(mcp_servers), max_turns=max_turns,
             max_tool_response_length=max_tool_response_length, agent_program=agent_program,
             python_sandbox=python_sandbox)


ENV_ENTRY_KEYS = tuple(env_entry("FrozenLake").keys())
TOOL_LOOPS = ("tool", "program")  # the agent loops whose episodes may call tools


def load_file(path: str) -> ml_collections.ConfigDict:
  """`get_config()` of the config file at `path` (what --config=path loads, unvalidated):
  for a config built on another (configs/simple_sokoban.py) and for tests. As with
  --config, `path:arg` calls `get_config(arg)` (configs/sokoban.py:multiturn)."""
  path, sep, arg = path.partition(":")
  name = "rollx_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if sep else module.get_config()


def inactive_settings(config: ml_collections.ConfigDict) -> List[str]:
  """Warnings for valid settings that another key switches off (logged at start-up).

  Not errors: a shipped config with one of these on must still load when a flag turns
  the other key off (e.g. configs/frozenlake.py with drop_zero_advantage_samples=False
  for gae).
  """
  out = []
  if config.min_informative_groups > 0 and not config.drop_zero_advantage_samples:
    out.append(f"min_informative_groups={config.min_informative_groups} is inactive: "
               "dynamic sampling counts groups by advantages taken before the model runs, "
               "which needs drop_zero_advantage_samples=True")
  if (config.merge_identical_samples and config.drop_zero_advantage_samples
      and config.loss_agg_mode == "seq-mean-token-sum"):
    out.append("merge_identical_samples is inactive: a merged sample's count is a token "
               f"weight, which loss_agg_mode={config.loss_agg_mode!r} does not honour "
               "(it needs token-mean or seq-mean-token-mean)")
  strategy = config.actor_infer.strategy_args
  if strategy.keep_prefix_across_updates and not strategy.reuse_kv:
    out.append("actor_infer.strategy_args.keep_prefix_across_updates is inactive: no keys/"
               "values are kept across turns with reuse_kv=False")
  return out
