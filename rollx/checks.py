"""The one validation pass at start-up: `validate(config)` checks the whole tree against
rollx.config's defaults (unknown keys, wrong types), then each area's own rules, kept
beside the code that reads those keys (algorithm, roles' models, mesh, servers,
custom_envs entries, env managers, cluster). Every problem is reported with the dotted
key that caused it, e.g.

    config.train_env_manager.num_groups_partition: sums to 6, but num_env_groups is 8

It sits above the areas it imports; the entry points and tests call it.
"""

from __future__ import annotations

import os

import ml_collections

from rollx import cluster_checks, models
from rollx import config as config_lib
from rollx.algos import checks as algos_checks
from rollx.config_check import Checker, check_type, did_you_mean, is_int, type_name
from rollx.errors import ConfigError
from rollx.models import hf
from rollx.parallel import checks as parallel_checks
from rollx.rollout import checks as rollout_checks
from rollx.rollout.env_manager import check_env_managers
from rollx.serving import checks as serving_checks
from rollx.trainer import checks as trainer_checks


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks `config` in place (normalising int->float, list->tuple); raises ConfigError."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError([("", f"expected an ml_collections.ConfigDict, got {type(config).__name__}")])
  c = Checker()
  _tree(c, config, config_lib.default_config())
  if c.errors:  # the cross-key rules below assume a well-typed tree
    raise ConfigError(c.errors)
  _counts(c, config)
  algos_checks.check_algorithm(c, config)
  path = config.pretrain
  if path is not None and not os.path.isfile(os.path.join(path, "config.json")):
    c.error("pretrain", f"{path!r} is not a Hugging Face model directory (no config.json)")
  _rewards(c, config)
  _inert(c, config)
  _workers(c, config)
  if not c.errors:
    _adapter_dir(c, config)
  rollout_checks.check_custom_envs(c, config)
  check_env_managers(c, config)
  cluster_checks.check_cluster(c, config)
  if c.errors:
    raise ConfigError(c.errors)
  if isinstance(config.resume_from_checkpoint, bool):
    config.resume_from_checkpoint = "true" if config.resume_from_checkpoint else ""
  return config


def _leaf_type(cfg: ml_collections.ConfigDict, key: str):
  """(type, optional) of a default leaf; placeholders carry their declared type."""
  ref = cfg.get_ref(key)
  value = ref.get()
  if value is None:
    return ref.get_type(), True
  return type(value), False


def _tree(c: Checker, cfg, defaults, prefix: str = ""):
  """Unknown keys and leaf types of `cfg` against `defaults`, recursively."""
  for key in cfg.keys():
    path = prefix + key
    if key not in defaults:
      if prefix == "" or not path.startswith("custom_envs."):
        c.error(path, f"unknown key{did_you_mean(key, defaults.keys())}")
      continue
    if path == "custom_envs":
      continue  # free-form: tag -> entry, checked by rollx.rollout.checks
    default_value = defaults[key]
    value = cfg[key]
    if isinstance(default_value, ml_collections.ConfigDict):
      if not isinstance(value, (ml_collections.ConfigDict, dict)):
        c.error(path, f"expected a block of keys, got {type(value).__name__} {value!r}")
      else:
        _tree(c, value, default_value, path + ".")
      continue
    expected, optional = _leaf_type(defaults, key)
    expected = config_lib.UNION_TYPES.get(path, expected)
    if value is None and optional:
      continue
    ok, normalised = check_type(value, expected)
    if not ok:
      c.error(path, f"expected {type_name(expected)}"
              f"{' or None' if optional else ''}, got {type(value).__name__} {value!r}")
    elif normalised is not value:
      cfg[key] = normalised


def _counts(c: Checker, cfg):
  for key in ("max_steps", "save_steps", "logging_steps", "rollout_batch_size",
              "val_batch_size", "sequence_length", "ppo_epochs", "kl_horizon",
              "max_rollout_rounds"):
    if is_int(cfg[key]):
      c.rule(cfg[key] >= 1, key, f"must be >= 1, got {cfg[key]}")
  for key in ("eval_steps", "critic_warmup", "min_informative_groups", "warm_start_steps"):
    if is_int(cfg[key]):
      c.rule(cfg[key] >= 0, key, f"must be >= 0, got {cfg[key]}")


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


def _rewards(c: Checker, cfg):
  path = cfg.reward_pretrain
  if path is None:  # the env's reward is the only source: nothing else may be set
    defaults = config_lib.default_config()
    for key in ("reward_sources.env", "reward_sources.reward_model", "reward_batch_size"):
      value, default = _lookup(cfg, key), _lookup(defaults, key)
      c.rule(value == default, key, f"set, but there is no reward model (reward_pretrain is "
             f"unset); leave it at {default!r}")
    return
  if not os.path.isfile(os.path.join(path, "config.json")):
    c.error("reward_pretrain", f"{path!r} is not a Hugging Face model directory (no config.json)")
  else:  # config.json alone: cheap, and a wrong directory fails before Ray starts
    try:
      scorer = hf.load_model_config(path)
    except hf.CheckpointError as e:
      c.error("reward_pretrain", str(e))
      scorer = None
    try:
      policy = hf.load_model_config(models.resolve_model_dir(cfg.pretrain))
    except hf.CheckpointError as e:
      c.error("pretrain", str(e))
      policy = None
    if scorer is not None and policy is not None:
      c.rule(scorer.num_labels > 0, "reward_pretrain",
             f"{path} is a causal LM ({scorer.architecture}); a reward model is a "
             "sequence-classification directory (AutoModelForSequenceClassification)")
      c.rule(scorer.vocab_size == policy.vocab_size, "reward_pretrain",
             f"{path} has vocab_size {scorer.vocab_size}, the policy {policy.vocab_size}: "
             "a reward model reads the policy's tokens")
  c.rule(cfg.train_env_manager.env_manager_type != "step", "reward_pretrain",
         "the reward model scores whole trajectories; step-wise rows "
         "(train_env_manager.env_manager_type='step') are not scored")
  for key in ("env", "reward_model"):
    w = cfg.reward_sources[key]
    c.rule(isinstance(w, (int, float)) and w >= 0, f"reward_sources.{key}",
           f"a weight >= 0, got {w!r}")
  c.rule(cfg.reward_sources.env + cfg.reward_sources.reward_model > 0, "reward_sources",
         "every weight is 0: nothing to learn from")
  c.rule(is_int(cfg.reward_batch_size) and cfg.reward_batch_size >= 1, "reward_batch_size",
         f"must be an integer >= 1, got {cfg.reward_batch_size!r}")


def _adapter_dir(c: Checker, cfg):
  """actor_train's LoRA start (`lora.adapter_dir`): readable, for this base, these settings."""
  from rollx.models import lora
  if cfg.actor_train.model_args.lora.get("adapter_dir"):
    try:
      lora.check_adapter_dir(cfg.actor_train.model_args.lora,
                             hf.load_model_config(models.resolve_model_dir(cfg.pretrain)))
    except ConfigError as e:
      c.errors.extend(e.errors)


def _inert(c: Checker, cfg):
  defaults = config_lib.default_config()
  for block, reason in config_lib.INERT_KEYS.items():
    for path, value in _leaves(_lookup(cfg, block), block):
      default = _lookup(defaults, path)
      c.rule(value == default, path, f"not used: {reason}; leave it at its default {default!r}")


def _workers(c: Checker, cfg):
  # area by area in the order of a role's keys (model, optimizer, sampling, mesh,
  # servers, devices), the order a role's errors are listed in
  for role in config_lib.WORKER_ROLES:
    w = cfg[role]
    if not isinstance(w, (ml_collections.ConfigDict, dict)):
      continue
    trainer_checks.check_model_and_training(c, role, w)
    serving_checks.check_sampling(c, role, w)
    parallel_checks.check_strategy(c, role, w.strategy_args)
    serving_checks.check_server(c, role, w.strategy_args)
    parallel_checks.check_device_mapping(c, role, w.device_mapping)
  f = cfg.actor_train.get("model_update_frequency")
  if is_int(f):
    c.rule(f >= 1, "actor_train.model_update_frequency", f"must be >= 1, got {f}")
