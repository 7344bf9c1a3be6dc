import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from rollx import models
from rollx.models import hf, llm, logprobs
from tests.hf_fixtures import VARIANTS, make_hf_model

jax.config.update("jax_default_matmul_precision", "highest")


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs(a - b).max() / np.abs(b).max()


def ours(path):
  loaded = models.load_model(path)
  return loaded.model, loaded.params, loaded.config


def torch_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(ids))).logits.numpy()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(tmp_path, variant):
  ref_model, path = make_hf_model(tmp_path, variant)
  model, params, cfg = ours(path)
  assert cfg.architecture == ref_model.config.architectures[0]
  ids = np.random.default_rng(1).integers(0, 101, (3, 33))
  ref = torch_logits(ref_model, ids)
  assert rel_err(llm.forward(model, params, jnp.asarray(ids)), ref) < 1e-5


@pytest.mark.parametrize("variant", ["qwen2_gqa_untied", "llama_mha_bias_tied"])
def test_save_then_transformers_loads_same_logits(tmp_path, variant):
  _, path = make_hf_model(tmp_path, variant)
  model, params, cfg = ours(path)
  params = jax.tree.map(lambda x: x + 0.01, params)  # not just a copy of the input files
  out_dir = hf.save_pretrained(params, cfg, str(tmp_path / "saved"))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir, local_files_only=True)
  reloaded.eval()
  ids = np.random.default_rng(2).integers(0, 101, (2, 17))
  assert rel_err(llm.forward(model, params, jnp.asarray(ids)), torch_logits(reloaded, ids)) < 1e-5
  # and our loader round-trips our own files exactly
  again = hf.load_params(out_dir)
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sharded_checkpoint_loads(tmp_path):
  ref_model, _ = make_hf_model(tmp_path, "qwen2_gqa_untied")
  path = str(tmp_path / "sharded")
  ref_model.save_pretrained(path, max_shard_size="20KB")
  assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
  model, params, _ = ours(path)
  ids = np.arange(20)[None] % 101
  assert rel_err(llm.forward(model, params, jnp.asarray(ids)), torch_logits(ref_model, ids)) < 1e-5


@pytest.mark.parametrize("variant", ["qwen2_gqa_untied", "llama_gqa_nobias_untied"])
def test_kv_cache_decode_equals_full_forward(tmp_path, variant):
  _, path = make_hf_model(tmp_path, variant)
  model, params, cfg = ours(path)
  rng = np.random.default_rng(3)
  lengths = np.array([5, 9, 2])
  total = 24
  ids = rng.integers(0, 101, (3, total))
  full = np.asarray(llm.forward(model, params, jnp.asarray(ids)))
  # prefill right-padded prompts of different lengths into one batch, then decode
  prompt = np.where(np.arange(12)[None] < lengths[:, None], ids[:, :12], 0)
  last, cache = llm.prefill(model, params, jnp.asarray(prompt), jnp.asarray(lengths))
  for b in range(3):
    assert rel_err(last[b], full[b, lengths[b] - 1]) < 1e-5
  cache = llm.pad_cache(cache, total)
  pos = lengths.copy()
  step = jax.jit(llm.decode_step, static_argnums=0)
  while pos.max() < total:
    p = np.minimum(pos, total - 1)
    logits, cache = step(model, params, jnp.asarray(ids[np.arange(3), p]), jnp.asarray(p), cache)
    for b in range(3):
      if pos[b] < total:
        assert rel_err(logits[b], full[b, pos[b]]) < 1e-5, (b, pos[b])
    pos += 1


@pytest.mark.parametrize("variant", ["qwen2_gqa_tied", "llama_mha_bias_tied"])
def test_greedy_32_tokens_equal_transformers_generate(tmp_path, variant):
  ref_model, path = make_hf_model(tmp_path, variant, eos_token_id=None)
  model, params, _ = ours(path)
  for seed in range(3):
    prompt = np.random.default_rng(seed).integers(1, 101, (1, 5 + 4 * seed))
    with torch.no_grad():
      ref = ref_model.generate(torch.tensor(prompt), max_new_tokens=32, min_new_tokens=32,
                               do_sample=False)
    assert llm.greedy_generate(model, params, prompt[0], 32) == ref[0, prompt.shape[1]:].tolist()


def test_packed_segments_equal_separate_sequences(tmp_path):
  _, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  model, params, _ = ours(path)
  a, b = np.arange(1, 8), np.arange(20, 31)
  packed = np.concatenate([a, b, [0, 0]])[None]
  seg = np.array([[1] * 7 + [2] * 11 + [0, 0]])
  logp, ent = logprobs.compute_logprobs(model, params, jnp.asarray(packed), jnp.asarray(seg))
  logp_a, ent_a = logprobs.compute_logprobs(model, params, jnp.asarray(a[None]))
  logp_b, _ = logprobs.compute_logprobs(model, params, jnp.asarray(b[None]))
  np.testing.assert_allclose(logp[0, :7], logp_a[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(logp[0, 7:18], logp_b[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ent[0, :7], ent_a[0], rtol=1e-5, atol=1e-6)
  assert float(logp[0, 7]) == 0.0 and np.all(np.asarray(logp[0, 18:]) == 0)


def test_logprobs_and_entropy_match_torch(tmp_path):
  ref_model, path = make_hf_model(tmp_path, "llama_gqa_nobias_untied")
  model, params, _ = ours(path)
  ids = np.random.default_rng(4).integers(0, 101, (2, 15))
  ref = torch.log_softmax(torch.tensor(torch_logits(ref_model, ids)), -1)
  ref_logp = ref[:, :-1].gather(-1, torch.tensor(ids[:, 1:, None]))[..., 0].numpy()
  ref_ent = -(ref.exp() * ref).sum(-1)[:, :-1].numpy()
  logp, ent = logprobs.compute_logprobs(model, params, jnp.asarray(ids))
  assert rel_err(logp[:, 1:], ref_logp) < 1e-5 and rel_err(ent[:, 1:], ref_ent) < 1e-5
  mask = np.zeros_like(ids)
  mask[:, 9:] = 1
  expected = (ref_logp[:, 8:]).mean()
  assert abs(float(logprobs.masked_mean(logp, jnp.asarray(mask))) - expected) < 1e-5


def test_critic_shares_trunk_and_starts_at_zero(tmp_path):
  _, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  policy = models.load_model(path)
  critic = models.load_model(path, head="value")
  assert "lm_head" not in critic.params and critic.params["value_head"].shape == (64,)
  np.testing.assert_array_equal(critic.params["layers"]["q_proj"], policy.params["layers"]["q_proj"])
  values = llm.forward(critic.model, critic.params, jnp.arange(10)[None])
  assert values.shape == (1, 10) and float(jnp.abs(values).max()) == 0.0
  params = dict(critic.params, value_head=jnp.ones(64))
  grads = jax.grad(lambda p: llm.forward(critic.model, p, jnp.arange(10)[None]).sum())(params)
  assert float(jnp.abs(grads["layers"]["q_proj"]).max()) > 0


def test_values_are_of_the_state_before_each_token(tmp_path):
  """compute_values[:, t] = V(tokens < t): token t cannot move its own baseline (GAE
  credits the action token with Q(s, a) - V(s), not R - Q(s, a)); a token opening a
  packed segment gets 0, and packing changes nothing."""
  _, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  critic = models.load_model(path, head="value")
  params = dict(critic.params, value_head=jax.random.normal(jax.random.PRNGKey(0), (64,)))
  ids = np.random.default_rng(5).integers(1, 101, (1, 12))
  values = logprobs.compute_values(critic.model, params, jnp.asarray(ids))
  heads = llm.forward(critic.model, params, jnp.asarray(ids))
  assert float(values[0, 0]) == 0.0
  np.testing.assert_allclose(values[0, 1:], heads[0, :-1], rtol=1e-6, atol=1e-7)
  changed = ids.copy()
  changed[0, 6] = (changed[0, 6] % 100) + 1  # another action at t = 6
  values_changed = logprobs.compute_values(critic.model, params, jnp.asarray(changed))
  np.testing.assert_array_equal(values_changed[0, :7], values[0, :7])
  assert abs(float(values_changed[0, 7] - values[0, 7])) > 1e-4
  a, b = ids[0, :5], ids[0, 5:]
  packed = jnp.asarray(np.concatenate([a, b, [0]])[None])
  seg = jnp.asarray(np.array([[1] * 5 + [2] * 7 + [0]]))
  values_packed = logprobs.compute_values(critic.model, params, packed, seg)
  values_b = logprobs.compute_values(critic.model, params, jnp.asarray(b[None]))
  np.testing.assert_allclose(values_packed[0, :5], values[0, :5], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(values_packed[0, 5:12], values_b[0], rtol=1e-5, atol=1e-6)
  assert float(values_packed[0, 5]) == 0.0 and float(values_packed[0, 12]) == 0.0


def test_remat_and_dtype_options(tmp_path):
  _, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  base = models.load_model(path)
  remat = models.load_model(path, remat=True)
  ids = jnp.asarray(np.random.default_rng(5).integers(0, 101, (2, 12)))
  loss = lambda m: lambda p: logprobs.compute_logprobs(m, p, ids)[0].sum()
  g1 = jax.grad(loss(base.model))(base.params)
  g2 = jax.grad(loss(remat.model))(remat.params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  bf16 = models.load_model(path, dtype="bf16")
  out = llm.forward(bf16.model, bf16.params, ids)
  assert out.dtype == jnp.float32 and bf16.params["norm"].dtype == jnp.float32
  with pytest.raises(ValueError, match="model_args.dtype"):
    llm.make_model(base.config, dtype="int8")


def test_blocked_attention_equals_dense_and_transformers(tmp_path):
  """Rows longer than `attention_block` attend in query blocks (the last one ragged):
  logits equal transformers' and the dense softmax's, and so do packed-row log-probs,
  their gradients under remat, and a prefill's last logits and KV cache."""
  ref_model, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  dense = models.load_model(path, attention_block=0)
  blocked = models.load_model(path, attention_block=8)
  rng = np.random.default_rng(7)
  ids = rng.integers(1, 101, (2, 45))  # 45 = 5 blocks of 8 + 5
  logits = llm.forward(blocked.model, blocked.params, jnp.asarray(ids))
  assert rel_err(logits, torch_logits(ref_model, ids)) < 1e-5
  np.testing.assert_allclose(logits, llm.forward(dense.model, dense.params, jnp.asarray(ids)),
                             rtol=1e-5, atol=1e-6)

  # packed segments and padding across block edges; gradients through remat
  seg = jnp.asarray([[1] * 11 + [2] * 20 + [3] * 9 + [0] * 5, [1] * 30 + [2] * 15])
  def loss(block):
    model = llm.make_model(dense.config, remat=True, attention_block=block)
    return lambda p: logprobs.compute_logprobs(model, p, jnp.asarray(ids), seg)[0].sum()
  (l0, g0), (l8, g8) = (jax.value_and_grad(loss(b))(dense.params) for b in (0, 8))
  np.testing.assert_allclose(l8, l0, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g8), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

  lengths = jnp.asarray([45, 19])
  prompt = jnp.where(jnp.arange(45)[None] < lengths[:, None], jnp.asarray(ids), 0)
  (last_b, cache_b), (last_d, cache_d) = (
      llm.prefill(m.model, m.params, prompt, lengths) for m in (blocked, dense))
  np.testing.assert_allclose(last_b, last_d, rtol=1e-5, atol=1e-6)
  for a, b in zip(cache_b, cache_d):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# -- malformed checkpoints --------------------------------------------------------


def _edit_tensors(path, fn):
  f = os.path.join(path, "model.safetensors")
  tensors = safetensors.numpy.load_file(f)
  fn(tensors)
  safetensors.numpy.save_file(tensors, f)


def test_missing_tensor_is_named(tmp_path):
  _, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  _edit_tensors(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
  with pytest.raises(hf.CheckpointError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias.*missing"):
    hf.load_params(path)


def test_wrong_shape_is_named(tmp_path):
  _, path = make_hf_model(tmp_path, "llama_gqa_nobias_untied")
  _edit_tensors(path, lambda t: t.update({"model.layers.2.mlp.up_proj.weight": np.zeros((95, 64), np.float32)}))
  with pytest.raises(hf.CheckpointError, match=r"up_proj\.weight' has shape \(95, 64\), expected \(96, 64\)"):
    hf.load_params(path)


def test_unexpected_tensor_is_named(tmp_path):
  _, path = make_hf_model(tmp_path, "llama_gqa_nobias_untied")
  _edit_tensors(path, lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)}))
  with pytest.raises(hf.CheckpointError, match="model.extra.weight"):
    hf.load_params(path)


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"), "GPT2LMHeadModel"),
    (lambda c: c.pop("hidden_size"), "'hidden_size' is missing"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "rope"),
    (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads=3"),
])
def test_bad_config_field_is_named(tmp_path, edit, match):
  _, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  cfg_path = os.path.join(path, "config.json")
  raw = json.load(open(cfg_path))
  edit(raw)
  json.dump(raw, open(cfg_path, "w"))
  with pytest.raises(hf.CheckpointError, match=match):
    hf.load_model_config(path)


def test_missing_files_are_named(tmp_path):
  _, path = make_hf_model(tmp_path, "qwen2_gqa_untied")
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(hf.CheckpointError, match="no model.safetensors"):
    hf.load_params(path)
  with pytest.raises(hf.CheckpointError, match="config.json: file not found"):
    hf.load_model_config(str(tmp_path))
  with pytest.raises(hf.CheckpointError, match="no tokenizer files"):
    hf.load_tokenizer(path)
