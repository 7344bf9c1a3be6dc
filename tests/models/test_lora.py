"""LoRA adapters (rollx.models.lora): the decoder's low-rank path against folded weights,
PEFT directories against peft + transformers, the learner's frozen base and reference,
and the adapters-only weight sync a server folds into its base."""

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rollx import checks, config as config_lib, models
from rollx.errors import ConfigError
from rollx.models import lora, llm
from tests.conftest import ROOT
from tests.hf_fixtures import make_hf_model

jax.config.update("jax_default_matmul_precision", "highest")

CFG = llm.ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
IDS = jnp.asarray(np.random.default_rng(0).integers(0, 96, (3, 11)))


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / np.abs(b).max())


def trained_adapters(base, config, seed=1):
  """Adapters as after some training: B no longer zero."""
  fresh = lora.init_adapters(base, config, jax.random.PRNGKey(seed))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: np.asarray(x) + rng.normal(scale=0.1, size=x.shape)
                      .astype(np.float32), fresh)


@pytest.mark.parametrize("rslora", [False, True])
def test_the_low_rank_path_equals_the_folded_kernels_and_the_base_tree_is_the_base(rslora):
  config = lora.LoraConfig(4, 8.0, lora.PROJECTIONS, rslora)
  assert config.scale == (8.0 / 2 if rslora else 8.0 / 4)
  base_model = llm.make_model(CFG)
  base = llm.init_params(base_model, jax.random.PRNGKey(0))
  with_lora = llm.make_model(CFG, lora_scale=config.scale)
  adapters = trained_adapters(base, config)
  got = llm.forward(with_lora, lora.combine(base, adapters), IDS)
  want = llm.forward(base_model, lora.merge(base, adapters, config.scale), IDS)
  assert rel_err(got, want) < 1e-5
  assert rel_err(got, llm.forward(base_model, base, IDS)) > 1e-2  # the adapters do act
  # the base tree alone through the same model is the base model, bit for bit
  np.testing.assert_array_equal(llm.forward(with_lora, base, IDS),
                                llm.forward(base_model, base, IDS))
  # fresh adapters (B = 0) start from the base exactly
  fresh = lora.init_adapters(base, config, jax.random.PRNGKey(3))
  np.testing.assert_array_equal(llm.forward(with_lora, lora.combine(base, fresh), IDS),
                                llm.forward(base_model, base, IDS))
  assert lora.split(lora.combine(base, adapters))[1].keys() == {"layers"}


def test_adapter_gradients_equal_the_folded_kernels_gradients():
  config = lora.LoraConfig(3, 5.0, ("q_proj", "o_proj", "down_proj"))
  base_model = llm.make_model(CFG)
  base = llm.init_params(base_model, jax.random.PRNGKey(0))
  with_lora = llm.make_model(CFG, lora_scale=config.scale, remat=True)
  adapters = trained_adapters(base, config)
  loss = lambda logits: jnp.mean(jax.nn.log_softmax(logits)[..., 7] * jnp.arange(11))
  got = jax.grad(lambda a: loss(llm.forward(with_lora, lora.combine(base, a), IDS)))(adapters)
  want = jax.grad(lambda a: loss(llm.forward(base_model, lora.merge(base, a, config.scale),
                                             IDS)))(adapters)
  assert sorted(got["layers"]) == sorted(f"{n}{s}" for n in config.targets
                                         for s in (lora.SUFFIX_A, lora.SUFFIX_B))
  for key in got["layers"]:
    assert rel_err(got["layers"][key], want["layers"][key]) < 1e-5, key


@pytest.mark.parametrize("variant, targets, rslora", [
    ("qwen2_gqa_untied", lora.PROJECTIONS, False),
    ("llama_mha_bias_tied", "(q|v|up)_proj$", True)])
def test_peft_loads_the_adapter_directory_onto_transformers_with_rollx_logits(
    tmp_path, variant, targets, rslora):
  import peft
  _, path = make_hf_model(tmp_path, variant)
  loaded = models.load_model(path)
  block = config_lib.default_config().actor_train.model_args.lora
  block.update(rank=4, alpha=12.0, target_modules=targets, rslora=rslora)
  config = lora.from_config(block)
  adapters = trained_adapters(loaded.params, config)
  out = lora.save_peft(adapters, config, loaded.config, str(tmp_path / "adapter"), path)
  ids = np.random.default_rng(2).integers(0, 101, (2, 17))
  ours = llm.forward(llm.make_model(loaded.config, lora_scale=config.scale),
                     lora.combine(loaded.params, adapters), jnp.asarray(ids))
  base = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
  theirs = peft.PeftModel.from_pretrained(base, out).eval()
  with torch.no_grad():
    logits = theirs(torch.as_tensor(ids)).logits.numpy()
  assert rel_err(ours, logits) < 1e-5
  # and rollx reads the directory back exactly
  again, config_again = lora.load_peft(out, loaded.config)
  assert config_again == config
  for key, value in adapters["layers"].items():
    np.testing.assert_array_equal(again["layers"][key], value)


def test_lora_keys_are_checked_and_named():
  def errors(**lora_keys):
    c = config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py"))
    for dotted, value in lora_keys.items():
      role, key = dotted.split("__")
      c[role].model_args.lora[key] = value
    with pytest.raises(ConfigError) as e:
      checks.validate(c)
    return e.value.errors
  assert errors(actor_train__rank=4, actor_train__target_modules=("q_proj", "qkv")) == [
      ("actor_train.model_args.lora.target_modules",
       "'qkv': name projections of " + ", ".join(lora.PROJECTIONS))]
  assert errors(actor_train__rank=4, actor_train__target_modules="attn")[0][0] == \
      "actor_train.model_args.lora.target_modules"
  assert errors(actor_train__rank=4, actor_train__alpha=0.0)[0][0] == \
      "actor_train.model_args.lora.alpha"
  assert errors(actor_train__rank=-2)[0][0] == "actor_train.model_args.lora.rank"
  assert errors(critic__rank=2)[0] == (
      "critic.model_args.lora.rank", "not used: the critic trains in full (its value head "
      "is new); leave it at its default 0")


# -- the learner and the servers ---------------------------------------------------------


def lora_learner():
  from rollx.trainer.learner import Learner
  return Learner(checks.validate(lora_learner_config()), models.load_model(None))


def lora_learner_config():
  c = config_lib.default_config()
  c.custom_envs.FrozenLake = config_lib.env_entry("FrozenLake")
  c.update(max_steps=4, rollout_batch_size=4, sequence_length=16, use_kl_loss=True)
  c.train_env_manager.update(group_size=4, num_env_groups=1)
  c.actor_train.device_mapping = c.reference.device_mapping = (0,)  # one mesh: one program
  c.actor_train.training_args.update(per_device_train_batch_size=4, learning_rate=1e-2,
                                     warmup_steps=0)
  c.actor_train.model_args.lora.update(rank=4, alpha=8.0)
  return c


def test_the_learner_trains_adapters_on_a_frozen_base_that_is_also_the_reference():
  learner = lora_learner()
  state = learner.actor_state
  base_before = jax.device_get(state.frozen)
  assert learner.reference_params() is state.frozen  # no second copy of the weights
  rng = np.random.default_rng(0)
  samples = {"input_ids": rng.integers(3, 500, (4, 16)).astype(np.int32),
             "segment_ids": np.ones((4, 16), np.int32),
             "response_mask": np.tile((np.arange(16) >= 12).astype(np.float32), (4, 1))}
  adv = samples["response_mask"] * np.array([[1.0], [-0.5], [2.0], [-1.0]], np.float32)
  inputs = {k: jnp.asarray(samples[k]) for k in ("input_ids", "segment_ids")}
  base_logp = np.asarray(learner.actor.compute_logprobs(learner.reference_params(), inputs)[0])
  metrics = {}
  for step in range(2):
    learner.learn(types.SimpleNamespace(trajectories=[None] * 4), samples, adv, adv.copy(),
                  step, metrics)
  state = learner.actor_state
  for a, b in zip(jax.tree.leaves(jax.device_get(state.frozen)), jax.tree.leaves(base_before)):
    np.testing.assert_array_equal(a, b)
  assert float(np.abs(np.asarray(state.params["layers"]["q_proj_lora_b"])).max()) > 0
  # the second step's KL is the adapted policy against the base, measured
  assert metrics["kl"] != 0 and np.isfinite(metrics["actor/loss"])
  policy = np.asarray(learner.actor.compute_logprobs(learner.actor.model_params(state),
                                                     inputs)[0])
  ref = np.asarray(learner.reference.compute_logprobs(learner.reference_params(), inputs)[0])
  np.testing.assert_array_equal(ref, base_logp)
  assert np.abs(policy - ref).max() > 1e-4
  # what a weight sync sends: the adapters alone
  payload = learner.host_params()
  assert isinstance(payload, lora.AdapterWeights) and payload.scale == 2.0
  assert all(lora.is_adapter(k) for k in payload.tensors["layers"])
  assert lora.nbytes(payload) < lora.nbytes(base_before) / 5
  merged = learner.policy_params()
  folded = llm.make_model(learner.model_config)
  got = logp_of(folded, merged, inputs)
  assert rel_err(got, policy) < 1e-5


def logp_of(model, params, inputs):
  from rollx.models import logprobs
  return np.asarray(logprobs.compute_logprobs(model, params, inputs["input_ids"],
                                              inputs["segment_ids"])[0])


def test_a_server_folds_synced_adapters_into_its_base_and_a_restart_starts_from_them():
  from rollx.serving import server as server_lib
  config = config_lib.default_config()
  config.actor_infer.strategy_args.update(max_concurrent_decodes=2, max_prefill_length=16,
                                          max_cache_length=32)
  base = jax.device_get(models.load_model(None).params)
  scale = 2.0
  first = trained_adapters(base, lora.LoraConfig(4, 8.0, lora.PROJECTIONS), seed=1)
  second = trained_adapters(base, lora.LoraConfig(4, 8.0, lora.PROJECTIONS), seed=2)
  engine = server_lib.engine_from_config(config)
  for version, adapters in ((1, first), (2, second)):  # each onto the base, not the last merge
    engine.update_params(lora.AdapterWeights(adapters, scale), version)
    version_now, weights = engine.params_holder.get()
    want = lora.merge(base, adapters, scale)
    assert version_now == version
    for a, b in zip(jax.tree.leaves(jax.device_get(weights)), jax.tree.leaves(want)):
      assert rel_err(a, b) < 1e-6
  # a restarted server gets the board's payload: the adapters, onto the base it loads
  restarted = server_lib.engine_from_config(config, lora.AdapterWeights(second, scale), 2)
  for a, b in zip(jax.tree.leaves(jax.device_get(restarted.params_holder.get()[1])),
                  jax.tree.leaves(jax.device_get(engine.params_holder.get()[1]))):
    np.testing.assert_array_equal(a, b)


def test_training_starts_from_an_adapter_directory_with_its_settings(tmp_path):
  base = jax.device_get(models.load_model(None).params)
  settings = lora.LoraConfig(4, 8.0, lora.PROJECTIONS)
  adapters = trained_adapters(base, settings, seed=5)
  saved = lora.save_peft(adapters, settings, models.load_model(None).config,
                         str(tmp_path / "adapter"))
  from rollx.trainer.learner import Learner
  c = lora_learner_config()
  c.actor_train.model_args.lora.adapter_dir = saved
  learner = Learner(checks.validate(c), models.load_model(None))
  for key, value in adapters["layers"].items():
    np.testing.assert_array_equal(np.asarray(learner.actor_state.params["layers"][key]), value)
  c.actor_train.model_args.lora.alpha = 16.0
  with pytest.raises(ConfigError) as e:
    checks.validate(c)
  assert e.value.errors[0][0] == "actor_train.model_args.lora.adapter_dir"
  assert "alpha 8.0" in e.value.errors[0][1]
  c.actor_train.model_args.lora.update(alpha=8.0, adapter_dir=str(tmp_path))
  with pytest.raises(ConfigError, match="lora.adapter_dir: .*not a PEFT adapter directory"):
    checks.validate(c)


def test_a_bf16_run_keeps_the_frozen_matrices_in_bf16_with_the_same_logits():
  from rollx.models import logprobs
  from rollx.parallel import mesh as mesh_lib
  from rollx.trainer.step import Trainer
  w = config_lib.default_config().actor_train
  w.model_args.dtype = "bf16"
  w.model_args.lora.update(rank=4, alpha=8.0)
  trainer = Trainer(CFG, w, mesh_lib.make_mesh(w.strategy_args, devices=jax.devices()[:1]),
                    None, total_steps=1)
  base = jax.device_get(llm.init_params(llm.make_model(CFG), jax.random.PRNGKey(0)))
  adapters = trained_adapters(base, trainer.lora)
  state = trainer.init_state(lora.combine(base, adapters))
  assert state.frozen["layers"]["q_proj"].dtype == jnp.bfloat16
  assert state.frozen["embed_tokens"].dtype == jnp.bfloat16
  assert state.frozen["layers"]["input_layernorm"].dtype == jnp.float32
  assert state.params["layers"]["q_proj_lora_a"].dtype == jnp.float32
  seg = jnp.ones_like(IDS)
  got = trainer.compute_logprobs(trainer.model_params(state), {"input_ids": IDS,
                                                               "segment_ids": seg})[0]
  want = logprobs.compute_logprobs(llm.make_model(CFG, "bf16", lora_scale=trainer.lora.scale),
                                   lora.combine(base, adapters), IDS, seg)[0]
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
