"""Every config key is real: it changes what runs, or setting it is an error naming it.

The inert keys of each role (rollx.config.INERT_KEYS) and the keys with one value per
role are named errors; the others are read by the code (checked statically over the
package), and the keys ROLL's configs carry that rollx once ignored
(generating_args.max_new_tokens, the reference role's block) have behaviour tests here.
"""

import asyncio
import os
import re

import numpy as np
import pytest

from rollx import checks, config as config_lib
from tests.conftest import ROOT

DEFAULTS = config_lib.default_config()


def leaves(cfg, prefix=""):
  for key in cfg.keys():
    value = cfg[key]
    if hasattr(value, "keys"):
      yield from leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def lookup(cfg, path):
  *parents, last = path.split(".")
  for part in parents:
    cfg = cfg[part]
  return cfg, last


def changed(value):
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value + 3
  if isinstance(value, str):
    return value + "x"
  if isinstance(value, tuple) and value:
    return value[:1]
  if value is None:  # an unset path (placeholder str)
    return "/x"
  raise AssertionError(value)


def base():
  config = config_lib.default_config()
  config.custom_envs.FrozenLake = config_lib.env_entry("FrozenLake")
  return config


def error_keys(config):
  with pytest.raises(config_lib.ConfigError) as e:
    checks.validate(config)
  return [k for k, _ in e.value.errors]


INERT = sorted(path for path, value in leaves(DEFAULTS)
               if any(path == b or path.startswith(b + ".") for b in config_lib.INERT_KEYS))


def test_inert_table_names_real_keys():
  for block in config_lib.INERT_KEYS:
    lookup(DEFAULTS, block)  # raises on a key that does not exist
  assert len(INERT) >= 40


@pytest.mark.parametrize("path", INERT)
def test_setting_an_inert_key_is_an_error_naming_it(path):
  config = base()
  parent, last = lookup(config, path)
  parent[last] = changed(parent[last])
  assert set(error_keys(config)) == {path}


ONE_VALUE = [
    ("critic.model_args.model_type", "causal_lm", "not one of value"),
    ("actor_train.model_args.model_type", "value", "not one of causal_lm"),
    ("actor_infer.strategy_args.strategy_name", "jax", "not one of jetstream"),
    ("actor_train.strategy_args.strategy_name", "megatron_train", "not one of jax"),
    ("actor_train.model_args.attn_implementation", "fa2", "not one of xla"),
    ("actor_infer.generating_args.num_return_sequences", 4, "must be 1"),
    ("actor_infer.val_generating_args.num_return_sequences", 2, "must be 1"),
]


@pytest.mark.parametrize("path,value,message", ONE_VALUE)
def test_one_value_keys_are_named_errors(path, value, message):
  config = base()
  parent, last = lookup(config, path)
  parent[last] = value
  with pytest.raises(config_lib.ConfigError) as e:
    checks.validate(config)
  assert [(k, message in m) for k, m in e.value.errors] == [(path, True)], e.value.errors


def name_of(path):
  return path.rsplit(".", 1)[-1]


# keys with one accepted value (per role): their test above sets every role's
ONE_VALUE_NAMES = {name_of(path) for path, _, _ in ONE_VALUE}


def test_one_value_keys_are_tested_for_every_role():
  tested = {path for path, _, _ in ONE_VALUE}
  for path, _ in leaves(DEFAULTS):
    if name_of(path) in ONE_VALUE_NAMES and path not in tested and path not in INERT:
      config = base()
      parent, last = lookup(config, path)
      parent[last] = changed(parent[last]) if parent[last] is not None else "/tmp"
      assert set(error_keys(config)) == {path}


def package_source():
  text = []
  for folder in ("rollx", "envs"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
      for name in files:
        if name.endswith(".py") and name != "config.py":
          text.append(open(os.path.join(dirpath, name)).read())
  return "\n".join(text)


def test_every_other_key_is_read_by_the_package():
  source = package_source()
  unread = []
  for path, _ in leaves(DEFAULTS):
    if path in INERT or path.startswith("custom_envs") or name_of(path) in ONE_VALUE_NAMES:
      continue
    name = name_of(path)
    if not re.search(rf"(\.{name}\b|\[\"{name}\"\]|get\(\"{name}\"|\b{name}=)", source):
      unread.append(path)
  assert unread == []


# -- behaviour of the keys ROLL's configs carry ------------------------------------------


@pytest.mark.parametrize("mode,max_new_tokens,expected", [
    ("train", 3, 3), ("train", 64, 8), ("val", 5, 5)])
def test_max_new_tokens_caps_every_turn_with_max_tokens_per_step(mode, max_new_tokens, expected):
  from rollx.models import hf, DEFAULT_MODEL_DIR
  from rollx.rollout.env_manager import EnvManager
  from rollx.rollout.env_worker import manager_kwargs
  from rollx.rollout.types import Ticket
  from rollx.serving.client import Generation
  config = config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py"))
  sampling = "generating_args" if mode == "train" else "val_generating_args"
  config.actor_infer[sampling].max_new_tokens = max_new_tokens
  config = checks.validate(config)
  manager = "train_env_manager" if mode == "train" else "val_env_manager"
  tokenizer = hf.load_tokenizer(DEFAULT_MODEL_DIR)
  asked = []

  async def generate(request_id, prompt_ids, max_tokens, **kwargs):
    asked.append(max_tokens)
    ids = tokenizer.encode("<answer>Up</answer>")[:max_tokens]
    return Generation(token_ids=ids, policy_version=0, token_versions=[0] * len(ids),
                      server="none")

  env = EnvManager(0, "FrozenLake", config.custom_envs.FrozenLake.to_dict(), tokenizer,
                   generate, **manager_kwargs(config, manager))
  asyncio.run(env.run_episode(Ticket(0, "FrozenLake", 0, 1, 1)))
  assert asked and set(asked) == {expected}
  assert env.builder.max_response_length == expected  # what ROLL's turn template states


def test_reference_role_runs_on_its_own_mesh_and_matches_the_actor():
  from rollx import models
  from rollx.trainer.learner import Learner
  config = config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py"))
  config.actor_train.strategy_args.update(dp_size=8)
  config.reference.strategy_args.update(dp_size=2, tp_size=2)
  config.reference.device_mapping = (4, 5, 6, 7)
  config = checks.validate(config)
  policy = models.load_model(None)
  learner = Learner(config, policy)
  assert learner.reference is not learner.actor
  mesh = learner.reference.mesh
  assert dict(mesh.shape)["tensor"] == 2 and {d.id for d in mesh.devices.flat} == {4, 5, 6, 7}
  leaf = learner.ref_params["layers"]["q_proj"]
  assert leaf.sharding.mesh == mesh and "tensor" in leaf.sharding.spec
  rng = np.random.default_rng(0)
  ids = rng.integers(3, policy.config.vocab_size, size=(4, 24)).astype(np.int32)
  batch = {"input_ids": ids, "segment_ids": np.ones_like(ids)}
  ref = np.asarray(learner.reference.compute_logprobs(learner.ref_params, batch)[0])
  act = np.asarray(learner.actor.compute_logprobs(learner.actor_state.params, batch)[0])
  np.testing.assert_allclose(ref, act, rtol=1e-5, atol=1e-5)
  # alike setups share one compiled pass
  same = Learner(checks.validate(config_lib.load_file(
      os.path.join(ROOT, "configs", "frozenlake.py"))), policy)
  assert same.reference is same.actor
