import ast
import glob
import os
import re
import types

from absl import flags
from ml_collections import config_flags
import pytest

from rollx import checks, config as config_lib
from rollx.rollout import scheduler
from tests.conftest import ROOT


def load(name):
  """A shipped config by name; "sokoban:multiturn" passes "multiturn" to get_config."""
  name, sep, arg = name.partition(":")
  return config_lib.load_file(os.path.join(ROOT, "configs", f"{name}.py{sep}{arg}"))


def errors_of(config):
  with pytest.raises(config_lib.ConfigError) as e:
    checks.validate(config)
  return dict(e.value.errors)


SHIPPED = ["frozenlake", "frozenlake:multiturn", "sokoban", "sokoban:multiturn", "simple_sokoban", "webshop"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_validate(name):
  config = checks.validate(load(name))
  assert config.custom_envs
  assert config_lib.inactive_settings(config) == []


def test_simple_sokoban_is_the_frozenlake_recipe_on_sokoban():
  frozenlake, sokoban = load("frozenlake"), load("simple_sokoban")
  assert list(sokoban.custom_envs) == ["SimpleSokoban"]
  assert sokoban.custom_envs.SimpleSokoban.env_type == "Sokoban"
  for manager in ("train_env_manager", "val_env_manager"):
    assert sokoban[manager].tags == ("SimpleSokoban",)
    assert sokoban[manager].env_manager_type == "step"
  for key in ("kl_loss_coef", "max_update_kl", "min_informative_groups",
              "drop_zero_advantage_samples", "rollout_batch_size", "val_batch_size",
              "episode_reward_gamma"):
    assert sokoban[key] == frozenlake[key], key
  # what Sokoban changes: step-level credit on shared boards, and the board's line
  assert (frozenlake.adv_estimator, sokoban.adv_estimator) == ("grpo", "gigpo")
  assert sokoban.custom_envs.SimpleSokoban.env_config.show_neighbours


def test_a_key_switched_off_by_another_is_warned_about():
  config = load("frozenlake")
  assert config.min_informative_groups > 0
  config.drop_zero_advantage_samples = False  # as the README's gae command does
  warnings = config_lib.inactive_settings(checks.validate(config))
  assert len(warnings) == 1 and "min_informative_groups" in warnings[0]
  assert "drop_zero_advantage_samples" in warnings[0]
  config.min_informative_groups = 0
  assert config_lib.inactive_settings(config) == []


def test_schema_covers_the_seed_keys():
  c = config_lib.default_config()
  for key in ("exp_name seed logging_dir output_dir render_save_dir max_steps save_steps "
              "logging_steps eval_steps resume_from_checkpoint pretrain reward_pretrain "
              "rollout_batch_size val_batch_size sequence_length adv_estimator ppo_epochs "
              "gamma lambd pg_clip init_kl_coef target_kl whiten_advantages entropy_loss_coef "
              "critic_warmup async_generation_ratio custom_envs").split():
    assert key in c, key
  for role in config_lib.WORKER_ROLES:
    for block in ("model_args", "training_args", "generating_args", "strategy_args",
                  "device_mapping"):
      assert block in c[role]
    assert {"tp_size", "pp_size"} <= set(c[role].strategy_args.keys())
  for m in config_lib.ENV_MANAGERS:
    assert {"max_env_num_per_worker", "num_env_groups", "group_size", "tags",
            "num_groups_partition"} <= set(c[m].keys())
  assert {"env_type", "env_config", "max_tokens_per_step"} <= set(
      config_lib.env_entry("FrozenLake").keys())


@pytest.mark.parametrize("mutate,key,match", [
    (lambda c: setattr(c, "max_steps", "abc"), "max_steps", "expected int"),
    (lambda c: setattr(c, "gamma", "high"), "gamma", "expected float"),
    (lambda c: setattr(c, "whiten_advantages", 1), "whiten_advantages", "expected bool"),
    (lambda c: setattr(c, "max_stepz", 3), "max_stepz", "did you mean 'max_steps'"),
    (lambda c: c.actor_train.training_args.__setattr__("lr", 1.0),
     "actor_train.training_args.lr", "unknown key"),
    (lambda c: c.actor_train.training_args.__setattr__("learning_rate", "fast"),
     "actor_train.training_args.learning_rate", "expected float"),
    (lambda c: setattr(c, "actor_train", 3), "actor_train", "block of keys"),
    (lambda c: setattr(c.train_env_manager, "tags", "FrozenLake"), "train_env_manager.tags",
     "expected tuple"),
])
def test_type_and_unknown_key_errors(mutate, key, match):
  config = load("frozenlake")
  mutate(config)
  errors = errors_of(config)
  assert key in errors and match in errors[key], errors


@pytest.mark.parametrize("mutate,key,match", [
    (lambda c: setattr(c.train_env_manager, "tags", ("FrozenLake", "Sokobam")),
     "train_env_manager.tags", "'Sokobam' has no custom_envs entry"),
    (lambda c: setattr(c.train_env_manager, "num_groups_partition", (14,)),
     "train_env_manager.num_groups_partition", "sums to 14, but num_env_groups is 16"),
    (lambda c: setattr(c.train_env_manager, "num_groups_partition", (8, 8)),
     "train_env_manager.num_groups_partition", "has 2 entries but tags has 1"),
    (lambda c: setattr(c, "rollout_batch_size", 100), "rollout_batch_size", "multiple"),
    (lambda c: setattr(c, "adv_estimator", "ppo"), "adv_estimator", "not one of"),
    (lambda c: setattr(c, "kl_loss_type", "low_var_kl"), "kl_loss_type", "not one of"),
    (lambda c: setattr(c, "max_steps", 0), "max_steps", ">= 1"),
    (lambda c: setattr(c, "gamma", 1.5), "gamma", "[0, 1]"),
    (lambda c: setattr(c, "max_update_kl", 0.0), "max_update_kl", "> 0"),
    (lambda c: setattr(c, "max_rollout_rounds", 0), "max_rollout_rounds", ">= 1"),
    (lambda c: setattr(c, "pretrain", "/nonexistent"), "pretrain", "no config.json"),
    (lambda c: setattr(c.actor_train.strategy_args, "tp_size", 0),
     "actor_train.strategy_args.tp_size", ">= 1 or -1"),
    (lambda c: setattr(c.critic.strategy_args, "tp_size", -1),
     "critic.strategy_args.tp_size", "only one of dp_size, tp_size"),
    (lambda c: setattr(c.actor_infer.generating_args, "top_p", 0.0),
     "actor_infer.generating_args.top_p", "(0, 1]"),
    (lambda c: setattr(c.actor_train.training_args, "lr_scheduler_type", "cosin"),
     "actor_train.training_args.lr_scheduler_type", "did you mean 'cosine'"),
    (lambda c: setattr(c.actor_train.training_args, "weight_decay_target", "inti"),
     "actor_train.training_args.weight_decay_target", "did you mean 'init'"),
    (lambda c: setattr(c.actor_infer.model_args, "attn_implementation", "cudnn"),
     "actor_infer.model_args.attn_implementation", "not one of"),
    (lambda c: setattr(c.critic.model_args, "attention_block", -1),
     "critic.model_args.attention_block", ">= 0"),
    (lambda c: setattr(c.val_env_manager, "group_size", 4), "val_env_manager.group_size",
     "group_size 1"),
    (lambda c: setattr(c.custom_envs.FrozenLake, "env_type", "FrozenLak"),
     "custom_envs.FrozenLake.env_type", "did you mean 'FrozenLake'"),
    (lambda c: setattr(c.custom_envs.FrozenLake.env_config, "slippery", True),
     "custom_envs.FrozenLake.env_config.slippery", "did you mean 'is_slippery'"),
    (lambda c: setattr(c.custom_envs.FrozenLake.env_config, "size", "4"),
     "custom_envs.FrozenLake.env_config.size", "expected int"),
    (lambda c: setattr(c.custom_envs.FrozenLake.env_config, "p", 0.0),
     "custom_envs.FrozenLake.env_config", "p must be in"),
    (lambda c: setattr(c.custom_envs.FrozenLake, "max_tokens_per_step", 0),
     "custom_envs.FrozenLake.max_tokens_per_step", ">= 1"),
    (lambda c: setattr(c.custom_envs.FrozenLake, "max_token_per_step", 8),
     "custom_envs.FrozenLake.max_token_per_step", "unknown key"),
    (lambda c: setattr(c.custom_envs.FrozenLake, "turn_template", "Turn {turn}: {observation}"),
     "custom_envs.FrozenLake.turn_template", "cannot be filled"),
    (lambda c: setattr(c.custom_envs.FrozenLake, "instructions", "Answer Left or Right."),
     "custom_envs.FrozenLake.instructions", "leaves out the system message"),
    (lambda c: setattr(c.train_env_manager, "env_manager_type", "steps"),
     "train_env_manager.env_manager_type", "did you mean 'step'"),
    (lambda c: setattr(c.train_env_manager, "group_filter_ratio", 0.0),
     "train_env_manager.group_filter_ratio", "(0, 1]"),
    (lambda c: setattr(c.actor_infer.strategy_args, "max_prefill_length", 100),
     "actor_infer.strategy_args.max_prefill_length", "power of two"),
    (lambda c: setattr(c, "adv_estimator", "gae"), "drop_zero_advantage_samples", "critic"),
    (lambda c: c.update(init_kl_coef=0.1, use_kl_loss=True), "init_kl_coef",
     "replaces by the KL loss"),
    (lambda c: (setattr(c, "adv_estimator", "gigpo"),
                setattr(c.train_env_manager, "env_manager_type", "trajectory")),
     "adv_estimator", "needs step-wise samples"),
    (lambda c: setattr(c, "dual_clip_ratio", 0.9), "dual_clip_ratio", "must be > 1"),
    (lambda c: setattr(c, "episode_reward_gamma", 1.2), "episode_reward_gamma", "[0, 1]"),
    (lambda c: c.update(episode_reward_gamma=0.9, adv_estimator="gae",
                        drop_zero_advantage_samples=False), "episode_reward_gamma",
     "gae discounts with gamma"),
    (lambda c: (setattr(c, "episode_reward_gamma", 0.9),
                setattr(c.train_env_manager, "env_manager_type", "trajectory")),
     "episode_reward_gamma", "needs step-wise samples"),
    (lambda c: c.update(init_kl_coef=0.1, use_kl_loss=False), "drop_zero_advantage_samples",
     "KL penalty in the reward"),
])
def test_rule_errors_name_the_key(mutate, key, match):
  config = load("frozenlake")
  mutate(config)
  errors = errors_of(config)
  assert key in errors and match in errors[key], errors


def test_all_errors_reported_in_one_line():
  config = load("frozenlake")
  config.max_steps = 0
  config.gamma = 2.0
  with pytest.raises(config_lib.ConfigError) as e:
    checks.validate(config)
  message = str(e.value)
  assert "\n" not in message and "config.max_steps" in message and "config.gamma" in message


def test_normalisation_and_partition():
  config = load("sokoban")
  config.gamma = 1
  config.val_env_manager.num_env_groups = 50
  config.resume_from_checkpoint = True
  checks.validate(config)
  assert isinstance(config.gamma, float) and config.resume_from_checkpoint == "true"
  assert scheduler.groups_per_tag(config.train_env_manager) == {
      "SimpleSokoban": 8, "LargerSokoban": 4, "SokobanDifferentGridVocab": 4}
  assert scheduler.groups_per_tag(config.val_env_manager) == {
      "SimpleSokoban": 17, "LargerSokoban": 17, "SokobanDifferentGridVocab": 16}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_fit_a_full_length_episode_of_every_env(name):
  """Every turn of the longest episode an env allows fits the config's token budgets.

  The env manager ends an episode whose context no longer fits (finish "length",
  counted in `<tag>/out_of_context_rate`) before the env's `max_steps`. A shipped config
  must never do that: each answer here is the longest the config lets the model write
  (`max_tokens_per_step` tokens, no EOS) and invalid, so the board never changes, no
  episode ends early, and every turn is spent."""
  import asyncio

  from rollx import models
  from rollx.models import hf
  from rollx.rollout.env_manager import EnvManager
  from rollx.rollout.env_worker import manager_kwargs
  from rollx.rollout.types import Ticket

  config = checks.validate(load(name))
  tokenizer = hf.load_tokenizer(models.resolve_model_dir(config.pretrain))
  filler = tokenizer.encode("?", add_special_tokens=False)

  async def longest_invalid_answer(request_id, prompt_ids, max_tokens, **kwargs):
    del request_id, prompt_ids, kwargs
    return types.SimpleNamespace(token_ids=filler * max_tokens, token_versions=[],
                                 policy_version=0)

  for manager in ("train_env_manager", "val_env_manager"):
    for tag in config[manager].tags:
      entry = config.custom_envs[tag].to_dict()
      env_manager = EnvManager(0, tag, entry, tokenizer, longest_invalid_answer,
                               **manager_kwargs(config, manager))
      max_steps = env_manager.env.config.max_steps
      traj = asyncio.run(env_manager.run_episode(Ticket(0, tag, 0, 0, 0)))
      assert (traj.finish, traj.num_turns, traj.num_invalid_actions) == (
          "truncated", max_steps, max_steps), (manager, tag)


def test_sokoban_layouts():
  step, multiturn = load("sokoban"), load("sokoban:multiturn")
  simple = load("simple_sokoban")
  # the default is simple_sokoban's recipe on three variants, each with the line
  for key in ("adv_estimator", "gigpo_omega", "kl_loss_coef", "max_update_kl",
              "episode_reward_gamma", "rollout_batch_size", "val_batch_size"):
    assert step[key] == simple[key], key
  assert set(step.custom_envs) == set(step.train_env_manager.tags) == {
      "SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab"}
  assert all(e.env_config.show_neighbours for e in step.custom_envs.values())
  for manager in ("train_env_manager", "val_env_manager"):
    assert (step[manager].env_manager_type, multiturn[manager].env_manager_type) == (
        "step", "trajectory")
  assert multiturn.adv_estimator == "grpo"
  with pytest.raises(ValueError, match=r"configs/sokoban.py.*'bogus'"):
    load("sokoban:bogus")


@pytest.mark.parametrize("name", ["tool_arithmetic", "langgraph_arithmetic", "openai_frozenlake"])
def test_agent_configs_validate(name):
  config = checks.validate(load(name))
  assert config_lib.inactive_settings(config) == []


@pytest.mark.parametrize("program,match", [
    ("", "expected 'package.module:function'"),
    ("examples.no_such_module:play", "No module named 'examples.no_such_module'"),
    ("examples.openai_frozenlake:nope", "has no attribute 'nope'"),
    ("examples.langgraph_agent:langchain_tools", "not an async function"),
])
def test_agent_program_errors_name_the_key(program, match):
  config = load("openai_frozenlake")
  config.custom_envs.FrozenLake.agent_program = program
  assert match in errors_of(config)["custom_envs.FrozenLake.agent_program"]
  config = load("frozenlake")
  config.custom_envs.FrozenLake.agent_program = "examples.openai_frozenlake:play"
  assert "use 'program'" in errors_of(config)["custom_envs.FrozenLake.agent_program"]


def _documented_commands(text):
  """The `--config.<key>=<value>` flags quoted in a config's docstring, grouped into the
  commands they form (flags with only white space between them), as a shell passes them:
  a flag may break over a line after a dot, a quoted value loses its quotes."""
  text = re.sub(r"\.\n\s+", ".", text)
  commands, end = [], None
  for m in re.finditer(r'--config\.([\w.]+)=("[^"]*"|[^\s`,;)]+)', text):
    # a sentence's full stop or colon after a flag is not its value's ("module:function" is)
    flag = f"--config.{m.group(1)}={m.group(2).strip(chr(34)).rstrip('.:')}"
    if end is not None and not text[end:m.start()].strip():
      commands[-1].append(flag)
    else:
      commands.append([flag])
    end = m.end()
  return commands


def _placeholder(flag):  # a path the reader fills in: DIR, /path/to/...
  value = flag.split("=", 1)[1]
  return value.isupper() or value.startswith("/path/to/")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))),
                         ids=os.path.basename)
def test_every_command_a_config_documents_applies_and_validates(path):
  """The flags a config's record gives (a tried setting, the GRPO variant) must work:
  each names a key the config has, and the command they form leaves it valid (a path
  left for the reader to fill in is only checked to apply)."""
  with open(path) as f:
    commands = _documented_commands(ast.get_docstring(ast.parse(f.read())) or "")
  for overrides in commands:
    argv = ["prog", f"--config={path}", *overrides]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=flag_values, lock_config=False,
                                    sys_argv=argv)  # it reads the overrides from argv
    try:
      flag_values(argv)
    except (flags.Error, AttributeError, KeyError) as e:
      pytest.fail(f"{os.path.basename(path)} documents {' '.join(overrides)}: {e}")
    if not any(_placeholder(flag) for flag in overrides):
      checks.validate(flag_values.config)
