"""Every config key with its default, and the one validation pass at start-up.

A config file (`configs/*.py`) starts from `default_config()`, changes what its
experiment needs, and adds its envs with `env_entry`. `validate` then checks the
whole tree once: unknown keys, wrong types, values out of range, and the
cross-key rules (env tags, group partitions, batch sizes). Every problem is
reported with the dotted key that caused it, e.g.

    config.train_env_manager.num_groups_partition: sums to 6, but num_env_groups is 8

Optional keys (None = unset) are ml_collections placeholders so that command-line
overrides such as `--config.pretrain=/path/to/hf_dir` know their type.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import ml_collections
from ml_collections import config_dict

import envs
from rollx.algos import correction
from rollx.errors import ConfigError  # noqa: F401  (re-exported: config.ConfigError)
from rollx.rollout import prompts
from rollx.serving import PREFILL_BUCKETS

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
}
ENV_MANAGERS = ("train_env_manager", "val_env_manager")
ENV_MANAGER_TYPES = ("trajectory", "step")

# Keys whose value may take one of several types (checked instead of the default's).
_UNION_TYPES = {"resume_from_checkpoint": (str, bool)}


def _cd(**fields) -> ml_collections.ConfigDict:
  # type_safe=False: type checks belong to `validate`, which names the key; a
  # type-safe ConfigDict would raise from inside the user's config file instead.
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
          # policy version and is logged (rollout/stale_reused_tokens_per_turn). Measured
          # 2026-11-27 on configs/openai_frozenlake.py, async ratio 1, 8 steps: 2-9% less
          # prefill on the steps it acted, but |delta log-prob| 3e-4..1.8e-3 (vs 1e-7 off)
          # on tokens the trainer takes as on-policy; off until a run shows it pays
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
      # > 0: before RL, a copy of `pretrain` in output_dir/warm_start is trained this many
      # steps on random-valid-action transcripts of the train envs (no reward, no task
      # signal; rollx.recipes.warm_start), for envs the model has never read.
      warm_start_steps=0,
      # True: that warm start's loss covers the policy's answers alone (the pages are
      # context). Long observations with short answers (WebShop) otherwise spend the loss
      # on predicting page text, and a product id never gets copied into a click.
      warm_start_responses_only=False,
      # reward model HF dir: unsupported (the envs score episodes); must stay unset
      reward_pretrain=config_dict.placeholder(str),
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


_ENV_ENTRY_KEYS = tuple(env_entry("FrozenLake").keys())
TOOL_LOOPS = ("tool", "program")  # the agent loops whose episodes may call tools


# -- validation ---------------------------------------------------------------


def _type_name(t) -> str:
  return t.__name__ if isinstance(t, type) else " or ".join(x.__name__ for x in t)


def _check_type(value, expected) -> Tuple[bool, Any]:
  """Whether `value` fits type `expected`; also returns it normalised (int->float, list->tuple)."""
  if isinstance(expected, tuple):
    return any(_check_type(value, t)[0] for t in expected), value
  if expected is bool:
    return isinstance(value, bool), value
  if expected is int:
    return isinstance(value, int) and not isinstance(value, bool), value
  if expected is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ok, float(value) if ok else value
  if expected is tuple:
    ok = isinstance(value, (tuple, list))
    return ok, tuple(value) if ok else value
  return isinstance(value, expected), value


def _leaf_type(cfg: ml_collections.ConfigDict, key: str):
  """(type, optional) of a default leaf; placeholders carry their declared type."""
  ref = cfg.get_ref(key)
  value = ref.get()
  if value is None:
    return ref.get_type(), True
  return type(value), False


def _did_you_mean(key: str, options) -> str:
  close = difflib.get_close_matches(key, list(options), n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


class _Checker:

  def __init__(self):
    self.errors: List[Tuple[str, str]] = []

  def error(self, key: str, message: str):
    self.errors.append((key, message))

  def tree(self, cfg, defaults, prefix: str = ""):
    """Unknown keys and leaf types of `cfg` against `defaults`, recursively."""
    for key in cfg.keys():
      path = prefix + key
      if key not in defaults:
        if prefix == "" or not path.startswith("custom_envs."):
          self.error(path, f"unknown key{_did_you_mean(key, defaults.keys())}")
        continue
      if path == "custom_envs":
        continue  # free-form: tag -> entry, checked by `custom_envs`
      default_value = defaults[key]
      value = cfg[key]
      if isinstance(default_value, ml_collections.ConfigDict):
        if not isinstance(value, (ml_collections.ConfigDict, dict)):
          self.error(path, f"expected a block of keys, got {type(value).__name__} {value!r}")
        else:
          self.tree(value, default_value, path + ".")
        continue
      expected, optional = _leaf_type(defaults, key)
      expected = _UNION_TYPES.get(path, expected)
      if value is None and optional:
        continue
      ok, normalised = _check_type(value, expected)
      if not ok:
        self.error(path, f"expected {_type_name(expected)}"
                   f"{' or None' if optional else ''}, got {type(value).__name__} {value!r}")
      elif normalised is not value:
        cfg[key] = normalised

  def rule(self, ok: bool, key: str, message: str):
    if not ok:
      self.error(key, message)

  def choice(self, cfg, key: str, path: str, options: Sequence[str]):
    value = cfg.get(key)
    if isinstance(value, str) and value not in options:
      self.error(path, f"{value!r} is not one of {', '.join(options)}"
                 f"{_did_you_mean(value, options)}")


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _ranges(c: _Checker, cfg):
  for key in ("max_steps", "save_steps", "logging_steps", "rollout_batch_size",
              "val_batch_size", "sequence_length", "ppo_epochs", "kl_horizon",
              "max_rollout_rounds"):
    if _is_int(cfg[key]):
      c.rule(cfg[key] >= 1, key, f"must be >= 1, got {cfg[key]}")
  for key in ("eval_steps", "critic_warmup", "min_informative_groups", "warm_start_steps"):
    if _is_int(cfg[key]):
      c.rule(cfg[key] >= 0, key, f"must be >= 0, got {cfg[key]}")
  for key in ("gamma", "lambd", "step_reward_gamma", "episode_reward_gamma"):
    if isinstance(cfg[key], float):
      c.rule(0.0 <= cfg[key] <= 1.0, key, f"must be in [0, 1], got {cfg[key]}")
  for key in ("pg_clip", "pg_clip_low", "pg_clip_high", "target_kl", "advantage_clip",
              "max_update_kl"):
    if isinstance(cfg[key], float):
      c.rule(cfg[key] > 0, key, f"must be > 0, got {cfg[key]}")
  for key in ("init_kl_coef", "kl_loss_coef", "async_generation_ratio"):
    if isinstance(cfg[key], float):
      c.rule(cfg[key] >= 0, key, f"must be >= 0, got {cfg[key]}")
  c.choice(cfg, "adv_estimator", "adv_estimator", ADV_ESTIMATORS)
  if isinstance(cfg.episode_reward_gamma, float) and cfg.episode_reward_gamma < 1.0:
    # the discount needs each step's reward, which only step-wise samples carry; gae
    # discounts with its own gamma along the tokens
    c.rule(cfg.train_env_manager.env_manager_type == "step", "episode_reward_gamma",
           "< 1 needs step-wise samples (train_env_manager.env_manager_type='step'), got "
           f"env_manager_type={cfg.train_env_manager.env_manager_type!r}")
    c.rule(cfg.adv_estimator != "gae", "episode_reward_gamma",
           "< 1 is for grpo / gigpo / reinforce; gae discounts with gamma")
  if cfg.drop_zero_advantage_samples is True:
    # the samples are chosen before log-probs and values exist (that is the saving)
    c.rule(cfg.adv_estimator != "gae", "drop_zero_advantage_samples",
           "needs advantages without a critic (gae has no exactly-zero advantages): "
           "set it to False with adv_estimator='gae'")
    c.rule(not (isinstance(cfg.init_kl_coef, float) and cfg.init_kl_coef > 0
                and not cfg.use_kl_loss), "drop_zero_advantage_samples",
           "cannot be combined with a KL penalty in the reward (init_kl_coef > 0 without "
           "use_kl_loss): that penalty makes every advantage non-zero")
  if isinstance(cfg.init_kl_coef, float) and cfg.init_kl_coef > 0:
    c.rule(not cfg.use_kl_loss, "init_kl_coef",
           f"{cfg.init_kl_coef} is the KL penalty in the reward, which use_kl_loss=True "
           "replaces by the KL loss (kl_loss_coef): set one of them")
  if cfg.adv_estimator == "gigpo":
    c.rule(cfg.train_env_manager.env_manager_type == "step", "adv_estimator",
           "gigpo's anchor states are env steps: it needs step-wise samples "
           "(train_env_manager.env_manager_type='step'); with trajectory-wise ones use grpo")
  c.choice(cfg, "rollout_correction", "rollout_correction", correction.CHOICES)
  if isinstance(cfg.rollout_correction_threshold, float):
    c.rule(cfg.rollout_correction_threshold > 1, "rollout_correction_threshold",
           f"must be > 1 (C caps weights at C; mis keeps [1/C, C]), got "
           f"{cfg.rollout_correction_threshold}")
  if isinstance(cfg.dual_clip_ratio, float):
    c.rule(cfg.dual_clip_ratio > 1, "dual_clip_ratio",
           f"must be > 1 (the cap sits beyond the clip range), got {cfg.dual_clip_ratio}")
  c.choice(cfg, "loss_agg_mode", "loss_agg_mode", LOSS_AGG_MODES)
  c.choice(cfg, "kl_loss_type", "kl_loss_type", KL_ESTIMATORS)
  if isinstance(cfg.reward_normalization, (ml_collections.ConfigDict, dict)):
    c.choice(cfg.reward_normalization, "grouping", "reward_normalization.grouping",
             NORM_GROUPINGS)
    c.choice(cfg.reward_normalization, "method", "reward_normalization.method", NORM_METHODS)


def _workers(c: _Checker, cfg):
  for role in WORKER_ROLES:
    w = cfg[role]
    if not isinstance(w, (ml_collections.ConfigDict, dict)):
      continue
    c.choice(w.model_args, "dtype", f"{role}.model_args.dtype", DTYPES)
    c.choice(w.model_args, "model_type", f"{role}.model_args.model_type", (ROLE_MODEL_TYPES[role],))
    c.choice(w.strategy_args, "strategy_name", f"{role}.strategy_args.strategy_name",
             (ROLE_STRATEGIES[role],))
    c.choice(w.model_args, "attn_implementation", f"{role}.model_args.attn_implementation",
             ATTN_IMPLEMENTATIONS)
    if _is_int(w.model_args.attention_block):
      c.rule(w.model_args.attention_block >= 0, f"{role}.model_args.attention_block",
             f"must be >= 0 (0: one dense softmax), got {w.model_args.attention_block}")
    t = w.training_args
    c.choice(t, "lr_scheduler_type", f"{role}.training_args.lr_scheduler_type",
             LR_SCHEDULERS)
    c.choice(t, "weight_decay_target", f"{role}.training_args.weight_decay_target",
             WEIGHT_DECAY_TARGETS)
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
      if _is_int(t[key]):
        c.rule(t[key] >= 1, f"{role}.training_args.{key}", f"must be >= 1, got {t[key]}")
    for key in ("learning_rate", "weight_decay"):
      if isinstance(t[key], float):
        c.rule(t[key] >= 0, f"{role}.training_args.{key}", f"must be >= 0, got {t[key]}")
    if _is_int(t.warmup_steps):
      c.rule(t.warmup_steps >= 0, f"{role}.training_args.warmup_steps",
             f"must be >= 0, got {t.warmup_steps}")
    g = w.generating_args
    if isinstance(g.temperature, float):
      c.rule(g.temperature >= 0, f"{role}.generating_args.temperature",
             f"must be >= 0, got {g.temperature}")
    if isinstance(g.top_p, float):
      c.rule(0 < g.top_p <= 1, f"{role}.generating_args.top_p", f"must be in (0, 1], got {g.top_p}")
    for key in ("top_k",):
      if _is_int(g[key]):
        c.rule(g[key] >= 0, f"{role}.generating_args.{key}", f"must be >= 0, got {g[key]}")
    for name in ("generating_args", "val_generating_args"):
      g = w.get(name)
      if g is None:
        continue
      if _is_int(g.max_new_tokens):
        c.rule(g.max_new_tokens >= 1, f"{role}.{name}.max_new_tokens",
               f"must be >= 1, got {g.max_new_tokens}")
      if _is_int(g.num_return_sequences):
        c.rule(g.num_return_sequences == 1, f"{role}.{name}.num_return_sequences",
               f"must be 1 (one response per request; a group's responses come from "
               f"train_env_manager.group_size envs on one level), got {g.num_return_sequences}")
    s = w.strategy_args
    fills = []
    for key in ("dp_size", "fsdp_size", "tp_size", "pp_size"):
      if _is_int(s[key]):
        c.rule(s[key] >= 1 or s[key] == -1, f"{role}.strategy_args.{key}",
               f"must be >= 1 or -1 (fill), got {s[key]}")
        if s[key] == -1:
          fills.append(key)
    c.rule(len(fills) <= 1, f"{role}.strategy_args.{fills[-1] if fills else ''}",
           f"only one of {', '.join(fills)} may be -1 (fill)")
    for key in ("num_microbatches", "max_concurrent_decodes", "num_servers"):
      if _is_int(s[key]):
        c.rule(s[key] >= 1, f"{role}.strategy_args.{key}", f"must be >= 1, got {s[key]}")
    for key in ("detokenize_depth", "prefix_cache_tokens"):
      if _is_int(s[key]):
        c.rule(s[key] >= 0, f"{role}.strategy_args.{key}", f"must be >= 0, got {s[key]}")
    if _is_int(s.max_restarts):
      c.rule(s.max_restarts >= -1, f"{role}.strategy_args.max_restarts",
             f"must be >= 0 or -1 (no limit), got {s.max_restarts}")
    if isinstance(s.restart_timeout_s, float):
      c.rule(s.restart_timeout_s >= 0, f"{role}.strategy_args.restart_timeout_s",
             f"must be >= 0, got {s.restart_timeout_s}")
    if _is_int(s.max_prefill_length):
      c.rule(s.max_prefill_length in PREFILL_BUCKETS, f"{role}.strategy_args.max_prefill_length",
             f"must be a power of two in [16, 32768] (JetStream's buckets), got "
             f"{s.max_prefill_length}")
      if _is_int(s.max_cache_length):
        c.rule(s.max_cache_length >= s.max_prefill_length,
               f"{role}.strategy_args.max_cache_length",
               f"{s.max_cache_length} is shorter than max_prefill_length={s.max_prefill_length}")
    dm = w.device_mapping
    if isinstance(dm, tuple):
      c.rule(all(_is_int(d) and d >= 0 for d in dm) and len(set(dm)) == len(dm) and dm,
             f"{role}.device_mapping", f"must be distinct device ids >= 0, got {dm}")
  f = cfg.actor_train.get("model_update_frequency")
  if _is_int(f):
    c.rule(f >= 1, "actor_train.model_update_frequency", f"must be >= 1, got {f}")


def _leaves(value, path: str):
  if isinstance(value, (ml_collections.ConfigDict, dict)):
    for key in value.keys():
      yield from _leaves(value[key], f"{path}.{key}")
  else:
    yield path, value


def _lookup(cfg, path: str):
  for part in path.split("."):
    cfg = cfg[part]
  return cfg


def _inert(c: _Checker, cfg):
  defaults = default_config()
  for block, reason in INERT_KEYS.items():
    for path, value in _leaves(_lookup(cfg, block), block):
      default = _lookup(defaults, path)
      c.rule(value == default, path, f"not used: {reason}; leave it at its default {default!r}")


def _custom_envs(c: _Checker, cfg):
  for tag, entry in cfg.custom_envs.items():
    path = f"custom_envs.{tag}"
    if not isinstance(entry, (ml_collections.ConfigDict, dict)):
      c.error(path, f"expected env_entry(...), got {type(entry).__name__} {entry!r}")
      continue
    for key in entry.keys():
      if key not in _ENV_ENTRY_KEYS:
        c.error(f"{path}.{key}", f"unknown key{_did_you_mean(key, _ENV_ENTRY_KEYS)}")
    env_type = entry.get("env_type")
    if env_type is None:
      c.error(f"{path}.env_type", "missing")
      continue
    if env_type not in envs.registered_env_types():
      c.error(f"{path}.env_type", f"unknown env_type {env_type!r}"
              f"{_did_you_mean(env_type, envs.registered_env_types())}; registered: "
              f"{', '.join(envs.registered_env_types())}")
      continue
    for key in ("max_tokens_per_step", "max_turns", "max_tool_response_length"):
      value = entry.get(key, 1)
      if not _is_int(value) or value < 1:
        c.error(f"{path}.{key}", f"must be an int >= 1, got {value!r}")
    loop = entry.get("agent_loop", "game")
    from rollx.rollout.agent_loops import AGENT_LOOPS
    from rollx import tools as tools_lib
    if loop not in AGENT_LOOPS:
      c.error(f"{path}.agent_loop", f"unknown agent loop {loop!r}; known: "
              f"{', '.join(sorted(AGENT_LOOPS))}")
    names = entry.get("tools", ())
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
      c.error(f"{path}.tools", f"expected a tuple of tool names, got {names!r}")
    else:
      unknown = [n for n in names if n not in tools_lib.registered_tools()]
      if unknown:
        c.error(f"{path}.tools", f"unknown tool {unknown[0]!r}; registered: "
                f"{', '.join(tools_lib.registered_tools())}")
      elif names and loop not in TOOL_LOOPS:
        c.error(f"{path}.tools", f"set, but agent_loop={loop!r} never calls tools (use 'tool')")
    from rollx.tools import sandbox
    mode = entry.get(sandbox.CONFIG_KEY, "bwrap")
    if mode not in sandbox.MODES:
      c.error(f"{path}.{sandbox.CONFIG_KEY}", f"unknown sandbox {mode!r}; known: "
              f"{', '.join(sandbox.MODES)}")
    servers = entry.get("mcp_servers", ())
    if not isinstance(servers, (tuple, list)) or not all(
        isinstance(x, str) and x.strip() for x in servers):
      c.error(f"{path}.mcp_servers", f"expected a tuple of commands, got {servers!r}")
    elif servers and loop not in TOOL_LOOPS:
      c.error(f"{path}.mcp_servers", f"set, but agent_loop={loop!r} never calls tools (use 'tool')")
    program = entry.get("agent_program", "")
    if loop == "program":
      from rollx.rollout.agent_loops import load_program
      try:
        load_program(program)
      except (ValueError, ImportError, AttributeError) as e:
        c.error(f"{path}.agent_program", str(e))
    elif program:
      c.error(f"{path}.agent_program", f"set, but agent_loop={loop!r} (use 'program')")
    for key in ("system_prompt", "turn_template", "instructions"):
      if not isinstance(entry.get(key, ""), str):
        c.error(f"{path}.{key}", f"expected str, got {entry.get(key)!r}")
    if entry.get("system_prompt") == prompts.NO_SYSTEM_PROMPT and entry.get("instructions"):
      c.error(f"{path}.instructions", f"set, but system_prompt={prompts.NO_SYSTEM_PROMPT!r} "
              "leaves out the system message that carries it")
    template = entry.get("turn_template", "")
    if isinstance(template, str) and template:
      try:
        template.format(turn_idx=1, observation="", actions_left=1, max_response_length=1)
      except (KeyError, IndexError, ValueError) as e:
        c.error(f"{path}.turn_template", f"cannot be filled ({type(e).__name__}: {e}); "
                "placeholders: {turn_idx} {observation} {actions_left} {max_response_length}")
    env_config = entry.get("env_config") or {}
    if not isinstance(env_config, (ml_collections.ConfigDict, dict)):
      c.error(f"{path}.env_config", f"expected a block of keys, got {env_config!r}")
      continue
    env_config = dict(env_config.items())
    fields = envs.env_config_fields(env_type)
    defaults = envs.env_class(env_type).Config()
    bad = False
    for key, value in env_config.items():
      if key not in fields:
        c.error(f"{path}.env_config.{key}",
                f"unknown key for env_type {env_type}{_did_you_mean(key, fields)}; "
                f"known: {', '.join(fields)}")
        bad = True
        continue
      default_value = getattr(defaults, key)
      if default_value is not None and value is not None:
        ok, normalised = _check_type(value, type(default_value))
        if not ok:
          c.error(f"{path}.env_config.{key}", f"expected {type(default_value).__name__}, "
                  f"got {type(value).__name__} {value!r}")
          bad = True
        else:
          env_config[key] = normalised
      if isinstance(value, ml_collections.ConfigDict):
        env_config[key] = value.to_dict()
    if not bad:
      try:  # the env's own checks (sizes, symbols, ...) by building one
        envs.make_env(env_type, env_config)
      except (ValueError, TypeError) as e:
        c.error(f"{path}.env_config", str(e))


# Ray's own resource names; a placement label must be a custom one.
_RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "TPU", "memory", "object_store_memory")


def _cluster(c: _Checker, cfg):
  addr = cfg.ray_address
  if addr is not None:
    c.rule(addr == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d+", addr) is not None,
           "ray_address", f"{addr!r}: expected 'auto' or host:port of a running Ray head")
  for role, name in cfg.ray_resources.items():
    if name:
      c.rule(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", name) is not None
             and name not in _RAY_BUILTIN_RESOURCES, f"ray_resources.{role}",
             f"{name!r}: expected a custom resource name (letters, digits, _ or -), "
             f"not one of {', '.join(_RAY_BUILTIN_RESOURCES)}")


def _symmetric_views(c: _Checker, cfg, name: str):
  m, key = cfg[name], f"{name}.symmetric_views"
  views = m.get("symmetric_views", ())
  if not views:
    return
  if not isinstance(views, (tuple, list)) or not all(isinstance(v, str) for v in views):
    c.error(key, f"must be a tuple of board symmetry names, got {views!r}")
    return
  c.rule(name == "train_env_manager", key, "views are training samples; validation "
         "plays the policy's own episodes only")
  c.rule(m.env_manager_type == "step", key,
         f"needs step-wise samples ({name}.env_manager_type='step'), got "
         f"{m.env_manager_type!r}")
  for view in views:
    if view not in envs.symmetry.TRANSFORMS:
      c.error(key, f"unknown board symmetry {view!r}"
              f"{_did_you_mean(view, envs.symmetry.TRANSFORMS)}; known: "
              f"{', '.join(envs.symmetry.TRANSFORMS)}")
  for tag in m.tags if isinstance(m.tags, tuple) else ():
    env_type = cfg.custom_envs[tag].get("env_type") if tag in cfg.custom_envs else None
    if env_type in envs.registered_env_types():
      missing = [v for v in views if v in envs.symmetry.TRANSFORMS
                 and v not in envs.env_class(env_type).SYMMETRIES]
      c.rule(not missing, key, f"env {tag!r} ({env_type}) has no board symmetry "
             f"{missing}; it has {list(envs.env_class(env_type).SYMMETRIES) or 'none'}")


def _env_managers(c: _Checker, cfg):
  for name in ENV_MANAGERS:
    m = cfg[name]
    if not isinstance(m, (ml_collections.ConfigDict, dict)):
      continue
    for key in ("max_env_num_per_worker", "num_env_groups", "group_size"):
      if _is_int(m[key]):
        c.rule(m[key] >= 1, f"{name}.{key}", f"must be >= 1, got {m[key]}")
    for key in ("history_length", "group_size_redundancy"):
      if _is_int(m[key]):
        c.rule(m[key] >= 0, f"{name}.{key}", f"must be >= 0, got {m[key]}")
    c.choice(m, "env_manager_type", f"{name}.env_manager_type", ENV_MANAGER_TYPES)
    _symmetric_views(c, cfg, name)
    if isinstance(m.group_filter_ratio, float):
      c.rule(0 < m.group_filter_ratio <= 1, f"{name}.group_filter_ratio",
             f"must be in (0, 1], got {m.group_filter_ratio}")
    tags = m.tags
    if not isinstance(tags, tuple):
      continue
    c.rule(len(tags) > 0, f"{name}.tags", "must name at least one custom_envs entry")
    for tag in tags:
      if tag not in cfg.custom_envs:
        c.error(f"{name}.tags", f"tag {tag!r} has no custom_envs entry"
                f"{_did_you_mean(str(tag), cfg.custom_envs.keys())}; "
                f"custom_envs has: {', '.join(cfg.custom_envs.keys()) or 'nothing'}")
      elif (cfg.custom_envs[tag].get("agent_loop") in TOOL_LOOPS
            and m.env_manager_type != "trajectory"):
        c.error(f"{name}.env_manager_type", f"tag {tag!r} runs agent_loop "
                f"{cfg.custom_envs[tag].get('agent_loop')!r}, whose episodes are "
                "conversations: needs 'trajectory'")
    part = m.num_groups_partition
    if part is not None and _is_int(m.num_env_groups):
      if len(part) != len(tags):
        c.error(f"{name}.num_groups_partition",
                f"has {len(part)} entries but tags has {len(tags)}")
      elif not all(_is_int(p) and p >= 0 for p in part):
        c.error(f"{name}.num_groups_partition", f"must be ints >= 0, got {part}")
      elif sum(part) != m.num_env_groups:
        c.error(f"{name}.num_groups_partition",
                f"sums to {sum(part)}, but num_env_groups is {m.num_env_groups}")
    elif _is_int(m.num_env_groups) and tags:
      c.rule(m.num_env_groups >= len(tags), f"{name}.num_env_groups",
             f"{m.num_env_groups} groups cannot cover {len(tags)} tags")
  gs = cfg.train_env_manager.group_size
  if _is_int(gs) and _is_int(cfg.rollout_batch_size) and gs >= 1:
    c.rule(cfg.rollout_batch_size % gs == 0, "rollout_batch_size",
           f"{cfg.rollout_batch_size} is not a multiple of train_env_manager.group_size={gs}"
           " (batches hold whole groups)")
  c.rule(cfg.val_env_manager.group_size == 1 or not _is_int(cfg.val_env_manager.group_size),
         "val_env_manager.group_size", "validation runs one env per group (group_size 1)")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks `config` in place (normalising int->float, list->tuple); raises ConfigError."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError([("", f"expected an ml_collections.ConfigDict, got {type(config).__name__}")])
  c = _Checker()
  c.tree(config, default_config())
  if c.errors:  # the cross-key rules below assume a well-typed tree
    raise ConfigError(c.errors)
  _ranges(c, config)
  path = config.pretrain
  if path is not None and not os.path.isfile(os.path.join(path, "config.json")):
    c.error("pretrain", f"{path!r} is not a Hugging Face model directory (no config.json)")
  c.rule(config.reward_pretrain is None, "reward_pretrain", "reward models are not supported: "
         "the envs score episodes (leave it unset)")
  _inert(c, config)
  _workers(c, config)
  _custom_envs(c, config)
  _env_managers(c, config)
  _cluster(c, config)
  if c.errors:
    raise ConfigError(c.errors)
  if isinstance(config.resume_from_checkpoint, bool):
    config.resume_from_checkpoint = "true" if config.resume_from_checkpoint else ""
  return config


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
