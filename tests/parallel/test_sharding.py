"""Sharded training on 8 simulated CPU devices equals the single-device step.

Meshes: (dp8), (fsdp4, tp2), (dp2, tp2, pp2), (tp2, pp4); policy and
critic; loss, gradients and updated params at rel 1e-5 (float32); arrays carry the
shardings the partition rules claim; the step compiles once.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rollx import config as config_lib
from rollx.models import llm, logprobs, lora
from rollx.parallel import partition
from rollx.parallel import mesh as mesh_lib, pipeline
from rollx.trainer import packing
from rollx.trainer.step import Trainer

jax.config.update("jax_default_matmul_precision", "highest")

CFG = llm.ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
B, T = 8, 16


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def policy_loss(model, params, batch, rng):
  logp, ent = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"])
  m = batch["response_mask"]
  return -logprobs.masked_mean(logp * batch["advantages"], m), {
      "entropy": logprobs.masked_mean(ent, m)}


def value_loss(model, params, batch, rng):
  values = llm.forward(model, params, batch["input_ids"], batch["segment_ids"])
  return logprobs.masked_mean((values - batch["returns"]) ** 2, batch["response_mask"]), {}


# "lora": the LM head's loss on LoRA adapters of every projection (rollx.models.lora)
LOSSES = {"lm": policy_loss, "value": value_loss, "lora": policy_loss}
LORA = dict(rank=4, alpha=8.0)


def make_batch(b=B, t=T, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(t // 2, t + 1, b)
  seg = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  return {
      "input_ids": rng.integers(0, CFG.vocab_size, (b, t)).astype(np.int32),
      "segment_ids": seg,
      "response_mask": (seg * (np.arange(t)[None] >= 5)).astype(np.float32),
      "advantages": rng.normal(size=(b, t)).astype(np.float32),
      "returns": rng.normal(size=(b, t)).astype(np.float32),
  }


@functools.lru_cache(maxsize=None)
def initial_params(head):
  if head == "lora":  # the base with adapters whose B is not zero: every gradient moves
    base = initial_params("lm")
    adapters = lora.init_adapters(base, lora.from_config(worker(lora_rank=4).model_args.lora),
                                  jax.random.PRNGKey(2))
    adapters = jax.tree.map(lambda x: np.asarray(x) + np.random.default_rng(3).normal(
        scale=0.1, size=x.shape).astype(np.float32), adapters)
    return lora.combine(base, adapters)
  params = jax.device_get(llm.init_params(llm.make_model(CFG, head=head), jax.random.PRNGKey(0)))
  if head == "value":  # a zero value head would zero every trunk gradient
    params["value_head"] = np.random.default_rng(1).normal(size=CFG.hidden_size).astype(np.float32)
  return params


def worker(dp=1, fsdp=1, tp=1, pp=1, microbatches=1, grad_accum=1, lora_rank=0):
  w = config_lib.default_config().actor_train
  w.model_args.lora.update(LORA, rank=lora_rank)
  w.strategy_args.update(dp_size=dp, fsdp_size=fsdp, tp_size=tp, pp_size=pp,
                         num_microbatches=microbatches)
  w.training_args.update(learning_rate=1e-2, gradient_accumulation_steps=grad_accum,
                         weight_decay=0.01,
                         # Adam's first step is ~ lr * g / |g|, discontinuous at g = 0;
                         # this eps keeps the update a smooth function of the grads
                         # so that updated params are comparable at rel 1e-5.
                         adam_eps=1e-3)
  return w


def run(w, head, devices, steps=2):
  mesh = mesh_lib.make_mesh(w.strategy_args, devices=devices)
  trainer = Trainer(CFG, w, mesh, LOSSES[head], total_steps=10,
                    head="value" if head == "value" else "lm")
  state = trainer.init_state(initial_params(head))
  batch = trainer.batch_sharding({k: jnp.asarray(v) for k, v in make_batch().items()})
  rng = jax.random.PRNGKey(1)
  loss, grads, _ = jax.jit(trainer.grads)(state.params, batch, rng, state.frozen)
  whole = trainer.model_params(state)
  logp = trainer.compute_values(whole, batch) if head == "value" else \
      trainer.compute_logprobs(whole, batch)[0]
  metrics = []
  for _ in range(steps):
    state, m = trainer.update(state, batch, rng)
    metrics.append(jax.device_get(m))
  return dict(trainer=trainer, state=state, loss=float(loss), grads=jax.device_get(grads),
              metrics=metrics, params=jax.device_get(state.params), logp=np.asarray(logp))


@functools.lru_cache(maxsize=None)
def reference(head):
  return run(worker(lora_rank=4 if head == "lora" else 0), head, jax.devices()[:1])


MESHES = {
    "dp8": dict(dp=8),
    "fsdp4_tp2": dict(fsdp=4, tp=2),
    "dp2_tp2_pp2": dict(dp=2, tp=2, pp=2, microbatches=2),
    "tp2_pp4": dict(tp=2, pp=4, microbatches=4),
}


def assert_same_step(got, ref):
  assert rel_err(got["loss"], ref["loss"]) < 1e-5
  for a, b in zip(jax.tree.leaves(got["grads"]), jax.tree.leaves(ref["grads"])):
    assert rel_err(a, b) < 1e-5
  assert rel_err(got["logp"], ref["logp"]) < 1e-5
  for step in range(2):
    assert rel_err(got["metrics"][step]["loss"], ref["metrics"][step]["loss"]) < 1e-5
  for path, a in jax.tree_util.tree_flatten_with_path(got["params"])[0]:
    b = functools.reduce(lambda t, k: t[k.key], path, ref["params"])
    assert rel_err(a, b) < 1e-5, path


# every mesh with the LM head; the value head (one vector more, its own rule) and LoRA
# adapters (their own rules, a frozen base) on the meshes that shard them (fsdp, tp) and
# that split the trunk every way (dp, tp, pp)
@pytest.mark.parametrize("mesh_name, head", [
    *((name, "lm") for name in sorted(MESHES)), ("fsdp4_tp2", "value"),
    ("dp2_tp2_pp2", "value"), ("fsdp4_tp2", "lora"), ("dp2_tp2_pp2", "lora")])
def test_sharded_step_equals_single_device(mesh_name, head):
  ref = reference(head)
  got = run(worker(**MESHES[mesh_name], lora_rank=4 if head == "lora" else 0), head,
            jax.devices())
  assert_same_step(got, ref)
  trainer, state = got["trainer"], got["state"]
  assert trainer.num_traces == 1  # two steps, one compilation
  mesh = trainer.mesh
  for path, leaf in jax.tree_util.tree_flatten_with_path(
      trainer.model_params(state))[0]:  # (with LoRA: the frozen base and the adapters)
    expected = partition.spec_for(path[-1].key, leaf.shape, mesh)
    assert leaf.sharding.spec == expected and leaf.sharding.mesh == mesh, path
  kernel = "q_proj_lora_b" if head == "lora" else "q_proj"
  mu = state.opt_state[1][0].mu  # clip -> adamw: (ScaleByAdamState, ...)
  assert mu["layers"][kernel].sharding.spec == state.params["layers"][kernel].sharding.spec
  if head == "lora":  # the base is frozen: no optimizer state, bitwise unchanged
    assert sorted(mu["layers"]) == sorted(state.params["layers"]) == sorted(
        f"{n}{s}" for n in lora.PROJECTIONS for s in (lora.SUFFIX_A, lora.SUFFIX_B))
    base = lora.split(initial_params("lora"))[0]
    for a, b in zip(jax.tree.leaves(jax.device_get(state.frozen)), jax.tree.leaves(base)):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mesh_name", ["fsdp4_tp2", "dp2_tp2_pp2"])
def test_sharded_blocked_attention_equals_single_device_dense(mesh_name):
  # Rows of 16 tokens attend in query blocks of 6 (the last one ragged) inside the
  # sharded step, and inside the pipeline schedule: the same step as the dense
  # softmax on one device.
  w = worker(**MESHES[mesh_name])
  w.model_args.attention_block = 6
  got = run(w, "lm", jax.devices())
  assert_same_step(got, reference("lm"))
  model = got["trainer"].model  # the setting reached the model (and the pipeline's stages)
  assert model.attention_block == 6
  assert model.layers_fn is None or model.layers_fn.keywords["attention_block"] == 6


def scored_policy_loss(model, params, batch, rng):
  logp, ent = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"],
                                        batch["score_index"])
  m = batch["response_mask"]
  return -logprobs.masked_mean(logp * batch["advantages"], m), {
      "entropy": logprobs.masked_mean(ent, m)}


@pytest.mark.parametrize("mesh_name", ["fsdp4_tp2", "dp2_tp2_pp2"])
def test_sharded_scored_head_equals_single_device_full_head(mesh_name):
  # the LM head at the response positions only (rollx.trainer.packing.score_positions),
  # gathered from a residual stream split over data/fsdp and pipeline stages
  ref = reference("lm")
  w = worker(**MESHES[mesh_name])
  trainer = Trainer(CFG, w, mesh_lib.make_mesh(w.strategy_args, devices=jax.devices()),
                    scored_policy_loss, total_steps=10)
  batch = make_batch()
  batch["score_index"] = packing.score_positions(batch["response_mask"], max_k=T)
  assert batch["score_index"] is not None
  batch = trainer.batch_sharding({k: jnp.asarray(v) for k, v in batch.items()})
  params = trainer.init_state(initial_params("lm")).params
  loss, grads, _ = jax.jit(trainer.grads)(params, batch, jax.random.PRNGKey(1))
  assert rel_err(loss, ref["loss"]) < 1e-5
  for a, b in zip(jax.tree.leaves(jax.device_get(grads)), jax.tree.leaves(ref["grads"])):
    assert rel_err(a, b) < 1e-5
  logp = np.asarray(trainer.compute_logprobs(params, batch)[0])
  on = np.asarray(batch["response_mask"]) > 0
  assert rel_err(logp[on], ref["logp"][on]) < 1e-5


def test_rules_place_megatron_and_fsdp_axes():
  devices = jax.devices()
  mesh = mesh_lib.make_mesh(worker(dp=1, fsdp=2, tp=2, pp=2).strategy_args, devices=devices)
  shard = lambda name, shape: partition.spec_for(name, shape, mesh)
  assert shard("q_proj", (4, 32, 4, 8)) == P("pipeline", "fsdp", "tensor", None)  # column
  assert shard("o_proj", (4, 4, 8, 32)) == P("pipeline", "tensor", None, "fsdp")  # row
  assert shard("gate_proj", (4, 32, 64)) == P("pipeline", "fsdp", "tensor")
  assert shard("down_proj", (4, 64, 32)) == P("pipeline", "tensor", "fsdp")
  assert shard("embed_tokens", (96, 32)) == P("tensor", "fsdp")
  assert shard("embed_tokens", (97, 32)) == P(None, "fsdp")  # odd vocab: replicated
  assert shard("norm", (32,)) == P(None)
  # LoRA: A takes its kernel's input split, B its output split, the rank replicated
  assert shard("q_proj_lora_a", (4, 32, 8)) == P("pipeline", "fsdp", None)
  assert shard("q_proj_lora_b", (4, 8, 4, 8)) == P("pipeline", None, "tensor", None)
  assert shard("o_proj_lora_a", (4, 4, 8, 8)) == P("pipeline", "tensor", None, None)
  assert shard("o_proj_lora_b", (4, 8, 32)) == P("pipeline", None, "fsdp")
  assert shard("down_proj_lora_a", (4, 64, 8)) == P("pipeline", "tensor", None)


@pytest.mark.parametrize("m_factor", [1, 4])  # one microbatch per stage, and four
def test_pipeline_matches_unpipelined(m_factor):
  s = 4
  mesh = mesh_lib.make_mesh(worker(dp=2, pp=s).strategy_args, devices=jax.devices())
  m = s * m_factor
  params = initial_params("lm")
  batch = make_batch(b=16)
  ids, seg = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["segment_ids"])
  plain = llm.make_model(CFG)
  piped = llm.make_model(CFG, layers_fn=functools.partial(
      pipeline.pipelined_layers, CFG, jnp.float32, False, mesh, m))

  def loss(model, p):
    logp, _ = logprobs.compute_logprobs(model, p, ids, seg)
    return logprobs.masked_mean(logp, jnp.asarray(batch["response_mask"]))

  p_sharded = jax.device_put(params, partition.param_shardings(params, mesh))
  want_l, want_g = jax.jit(jax.value_and_grad(functools.partial(loss, plain)))(params)
  got_l, got_g = jax.jit(jax.value_and_grad(functools.partial(loss, piped)))(p_sharded)
  want_logits = jax.jit(lambda p: llm.forward(plain, p, ids, seg))(params)
  got_logits = jax.jit(lambda p: llm.forward(piped, p, ids, seg))(p_sharded)
  assert rel_err(got_logits, want_logits) < 1e-6
  assert rel_err(got_l, want_l) < 1e-6
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    assert rel_err(a, b) < 1e-5


def test_gradient_accumulation_averages_strided_microbatches():
  devices = jax.devices()[:2]
  params = initial_params("lm")
  batch = make_batch()
  rng = jax.random.PRNGKey(1)
  plain = Trainer(CFG, worker(dp=2), mesh_lib.make_mesh(worker(dp=2).strategy_args,
                                                        devices=devices), policy_loss, 10)
  accum = Trainer(CFG, worker(dp=2, grad_accum=2), mesh_lib.make_mesh(
      worker(dp=2).strategy_args, devices=devices), policy_loss, 10)
  loss, grads, _ = jax.jit(accum.grads)(params, {k: jnp.asarray(v) for k, v in batch.items()}, rng)
  # microbatch i holds rows r with r % 2 == i; its rng is split(rng, 2)[i]
  parts = [jax.jit(plain.grads)(params, {k: jnp.asarray(v[i::2]) for k, v in batch.items()},
                               jax.random.split(rng, 2)[i]) for i in range(2)]
  assert rel_err(loss, (parts[0][0] + parts[1][0]) / 2) < 1e-5
  for a, b0, b1 in zip(*(jax.tree.leaves(g) for g in (grads, parts[0][1], parts[1][1]))):
    assert rel_err(a, (np.asarray(b0) + np.asarray(b1)) / 2) < 1e-5


@pytest.mark.parametrize("strategy,key,match", [
    (dict(dp=3), "actor_train.strategy_args", "multiply to 3, but"),
    (dict(dp=-1, tp=3), "actor_train.strategy_args.dp_size", "cannot fill"),
    (dict(tp=8), "actor_train.strategy_args.tp_size", "num_attention_heads=4"),
    (dict(dp=1, pp=8), "actor_train.strategy_args.pp_size", "num_hidden_layers=4"),
])
def test_bad_mesh_is_a_config_error_naming_the_key(strategy, key, match):
  w = worker(**strategy)
  with pytest.raises(config_lib.ConfigError) as e:
    mesh = mesh_lib.make_mesh(w.strategy_args, devices=jax.devices())
    partition.check_model_fits(CFG, mesh)
  assert any(k == key and match in msg for k, msg in e.value.errors), e.value.errors


def test_device_mapping_errors_and_subsets():
  w = worker(tp=2)
  mesh = mesh_lib.make_mesh(w.strategy_args, device_mapping=(6, 7), devices=jax.devices())
  assert [d.id for d in mesh.devices.flat] == [6, 7]
  with pytest.raises(config_lib.ConfigError, match="device_mapping"):
    mesh_lib.make_mesh(w.strategy_args, device_mapping=(7, 9), devices=jax.devices())
