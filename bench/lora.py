"""LoRA at the sizes users bring: train-step memory, sync bytes, and serving adapters
folded into the base once per sync vs the low-rank path in every decode step.

    python bench/lora.py [--rank 16] [--slots 32] [--max-new-tokens 64] [--repeats 2]
        [--memory-rank 64] [--shapes qwen2.5-0.5b,qwen2.5-7b]
    python bench/lora.py --quick    # `make bench`: the 0.5B shape's memory, 8 short requests

Memory (compile only, nothing allocated): the actor's jitted update of
configs/frozenlake.py in bf16 compute, gradient checkpointing on, on a minibatch of 4 rows x 512 tokens (128 scored),
for each shape with full fine-tuning and with rank `--memory-rank` adapters on every
projection: the train state's bytes (params, optimizer state, frozen base) and the
update's peak (XLA's memory analysis: its arguments plus temp buffers).

Both servers run the default model with the same trained adapters on every projection
(greedy, 32-token prompts): one holds the folded weights `W + scale A B` (what a rollx
server does at a sync), the other the base and the adapters, its decode step computing
`h W + scale (h A) B`. Prints ms per generated token of each, their ratio (low-rank /
folded), and the bytes of an adapters-only sync against a whole-model sync, for the
default model and the Qwen2.5-0.5B and 7B shapes (from shapes only: nothing allocated).
"""

import argparse
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rollx import models  # noqa: E402
from rollx.models import llm, lora  # noqa: E402
from serve import decode_seconds  # noqa: E402  (bench/serve.py: one server, timed)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAPES = {  # HF config fields of the shapes users bring
    "qwen2.5-0.5b": llm.ModelConfig(151936, 896, 4864, 24, 14, 2, 64, tie_word_embeddings=True,
                                    qkv_bias=True),
    "qwen2.5-7b": llm.ModelConfig(152064, 3584, 18944, 28, 28, 4, 128, qkv_bias=True),
}


def sync_bytes(config: llm.ModelConfig, rank: int):
  """(adapter bytes, whole-model bytes) of a float32 sync, from shapes only."""
  base = jax.eval_shape(lambda: llm.init_params(llm.make_model(config), jax.random.PRNGKey(0)))
  settings = lora.LoraConfig(rank, 2.0 * rank, lora.PROJECTIONS)
  adapters = jax.eval_shape(lambda: lora.init_adapters(base, settings, jax.random.PRNGKey(0)))
  size = lambda tree: sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(tree))
  return size(adapters), size(base)


def step_memory(config: llm.ModelConfig, rank: int, dtype: str = "bf16"):
  """(train-state bytes, update peak bytes) of the frozenlake actor's update at `rank`
  (0: full fine-tuning), compiled for one device."""
  import jax.numpy as jnp
  from rollx import config as config_lib
  from rollx.parallel import mesh as mesh_lib
  from rollx.trainer import learner as learner_lib
  c = config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py"))
  c.actor_train.model_args.dtype = dtype
  # remat on (the frozenlake config turns it off for its tiny model): at these sizes the
  # update's activations are most of its peak without it (0.5B, rank 64: 14.5 vs 4.8 GiB)
  c.actor_train.model_args.disable_gradient_checkpointing = False
  c.actor_train.model_args.lora.rank = rank
  c.actor_train.training_args.update(per_device_train_batch_size=4,
                                     gradient_accumulation_steps=1)
  c.sequence_length = 512
  mesh = mesh_lib.make_mesh(c.actor_train.strategy_args, devices=jax.devices()[:1])
  trainer = learner_lib.actor_trainer(c, config, mesh, 100)
  rows, t = 4, c.sequence_length
  spec = lambda shape, dtype: jax.ShapeDtypeStruct((rows,) + shape, dtype)
  batch = dict(input_ids=spec((t,), jnp.int32), segment_ids=spec((t,), jnp.int32),
               score_index=spec((128,), jnp.int32), response_mask=spec((t,), jnp.float32),
               old_logp=spec((t,), jnp.float32), ref_logp=spec((t,), jnp.float32),
               advantages=spec((t,), jnp.float32))
  update = trainer.update.lower(trainer.abstract_state, batch, jax.random.PRNGKey(0)).compile()
  memory = update.memory_analysis()
  state = sum(int(np.prod(x.shape)) * x.dtype.itemsize
              for x in jax.tree.leaves(trainer.abstract_state))
  return state, memory.argument_size_in_bytes + memory.temp_size_in_bytes


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rank", type=int, default=16)
  p.add_argument("--slots", type=int, default=32)
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--memory-rank", type=int, default=64)
  p.add_argument("--shapes", default=",".join(SHAPES), help="shapes whose memory to compile")
  p.add_argument("--quick", action="store_true",
                 help="the 0.5B shape's memory; 8 requests of 16 tokens, once")
  args = p.parse_args()
  if args.quick:
    args.slots, args.max_new_tokens, args.repeats, args.shapes = 8, 16, 1, "qwen2.5-0.5b"
  gib = 2**30
  for name in filter(None, args.shapes.split(",")):
    (full_state, full_peak), (lora_state, lora_peak) = (
        step_memory(SHAPES[name], rank) for rank in (0, args.memory_rank))
    print(f"{name}, bf16 compute, 4 x 512 tokens: train state {full_state / gib:.1f} GiB full "
          f"vs {lora_state / gib:.1f} GiB rank {args.memory_rank} ({full_state / lora_state:.1f}x); "
          f"update peak {full_peak / gib:.1f} vs {lora_peak / gib:.1f} GiB "
          f"({full_peak / lora_peak:.1f}x)", flush=True)
  loaded = models.load_model(None)
  settings = lora.LoraConfig(args.rank, 2.0 * args.rank, lora.PROJECTIONS)
  rng = np.random.default_rng(0)
  adapters = jax.tree.map(  # as after training: B no longer zero
      lambda x: np.asarray(x) + rng.normal(scale=0.02, size=x.shape).astype(np.float32),
      lora.init_adapters(loaded.params, settings, jax.random.PRNGKey(0)))
  folded = loaded._replace(params=lora.merge(jax.device_get(loaded.params), adapters,
                                             settings.scale))
  low_rank = loaded._replace(
      model=llm.make_model(loaded.config, lora_scale=settings.scale),
      params=lora.combine(jax.device_get(loaded.params), adapters))
  prompts = [rng.integers(3, loaded.config.vocab_size, 32).tolist() for _ in range(args.slots)]
  times = {"folded": [], "low_rank": []}
  for _ in range(args.repeats):
    for name, served in (("folded", folded), ("low_rank", low_rank)):
      times[name].append(decode_seconds(served, prompts, args.max_new_tokens, args.slots, 512))
  fold_ms, low_ms = (min(times[k]) * 1e3 for k in ("folded", "low_rank"))
  for name, config in (("default", loaded.config), *SHAPES.items()):
    a, whole = sync_bytes(config, args.rank)
    print(f"{name}: a rank-{args.rank} sync sends {a / 2**20:.1f} MiB of adapters, "
          f"{whole / a:.0f}x less than the whole model's {whole / 2**20:.1f} MiB")
  print(f"{jax.devices()[0].device_kind}: {args.slots} requests of 32 + {args.max_new_tokens} "
        f"tokens, rank {args.rank}: {fold_ms:.2f} ms a token with the adapters folded, "
        f"{low_ms:.2f} ms with the low-rank path in the decode step")
  print(f"decode time per token, low-rank path vs folded: ratio {low_ms / fold_ms:.2f}x")


if __name__ == "__main__":
  main()
