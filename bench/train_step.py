"""Train-step throughput and model FLOPs utilisation against the device's measured peak.

    python bench/train_step.py [--model default|qwen2.5-0.5b] [--batch 16 --seq 256]
                               [--dp 1 --fsdp 1 --tp 1 --pp 1 --microbatches 1] [--dtype fp32]
    python bench/train_step.py --quick    # `make bench`: default model, 4 x 64 tokens

Baseline, same process: a large square matmul in the same dtype on the same
devices gives the achievable peak FLOP/s. The train step (the policy-gradient loss
the trainer uses, grads, clip, AdamW, remat on) is timed after compilation. Model
FLOPs per token = 6 * params (matmuls, forward + backward) + 12 * layers * seq *
heads * head_dim (attention scores and mixing, forward + backward); remat's
recomputation is not counted (MFU, not hardware utilisation).
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rollx import config as config_lib, models  # noqa: E402
from rollx.models import llm, logprobs  # noqa: E402
from rollx.parallel import mesh as mesh_lib  # noqa: E402
from rollx.trainer.step import Trainer  # noqa: E402

QWEN_05B = llm.ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                           rope_theta=1e6, tie_word_embeddings=True, qkv_bias=True)


def matmul_peak(dtype, n=None, min_seconds=0.5, repeats=3):
  """Best-of-`repeats` FLOP/s of a square matmul on random data, each timing at least
  `min_seconds` long: a GPU finishes a 4096^3 product in ~0.2 ms, so a handful of
  them times launch overhead and clock ramp-up, not the matmul units."""
  n = n or (4096 if jax.default_backend() == "cpu" else 8192)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = 0.0
  for _ in range(repeats):
    iters, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
      out = f(a)
      iters += 1
      if iters % 8 == 0:  # keep the timed loop from queueing far ahead of the device
        out.block_until_ready()
    out.block_until_ready()
    best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
  return best


def loss_fn(model, params, batch, rng):
  logp, _ = logprobs.compute_logprobs(model, params, batch["input_ids"])
  return -logprobs.masked_mean(logp * batch["advantages"], batch["response_mask"]), {}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--model", default="default", choices=["default", "qwen2.5-0.5b"])
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
  p.add_argument("--iters", type=int, default=5)
  for axis in ("dp", "fsdp", "tp", "pp", "microbatches"):
    p.add_argument(f"--{axis}", type=int, default=1)
  p.add_argument("--quick", action="store_true",
                 help="default model, 4 x 64 tokens, 2 steps, a 1024^2 matmul (make bench)")
  args = p.parse_args()
  if args.quick:
    args.model, args.batch, args.seq, args.iters = "default", 4, 64, 2

  if args.model == "default":
    loaded = models.load_model(None)
    cfg, params = loaded.config, loaded.params
  else:
    cfg = QWEN_05B
    params = llm.init_params(llm.make_model(cfg), jax.random.PRNGKey(0))
  w = config_lib.default_config().actor_train
  w.model_args.dtype = args.dtype
  w.strategy_args.update(dp_size=args.dp, fsdp_size=args.fsdp, tp_size=args.tp,
                         pp_size=args.pp, num_microbatches=args.microbatches)
  devices = jax.devices()[:args.dp * args.fsdp * args.tp * args.pp]
  mesh = mesh_lib.make_mesh(w.strategy_args, devices=devices)
  trainer = Trainer(cfg, w, mesh, loss_fn, total_steps=100)
  state = trainer.init_state(params)
  rng = np.random.default_rng(0)
  batch = trainer.batch_sharding({
      "input_ids": jnp.asarray(rng.integers(0, cfg.vocab_size, (args.batch, args.seq)), jnp.int32),
      "advantages": jnp.asarray(rng.normal(size=(args.batch, args.seq)), jnp.float32),
      "response_mask": jnp.ones((args.batch, args.seq), jnp.float32),
  })
  key = jax.random.PRNGKey(0)
  state, m = trainer.update(state, batch, key)  # compile
  jax.block_until_ready(m)
  start = time.perf_counter()
  for _ in range(args.iters):
    state, m = trainer.update(state, batch, key)
  jax.block_until_ready(m)
  step_s = (time.perf_counter() - start) / args.iters

  tokens = args.batch * args.seq
  flops_per_token = 6 * cfg.num_params + 12 * cfg.num_layers * args.seq * cfg.num_heads * cfg.head_dim
  achieved = flops_per_token * tokens / step_s
  peak = matmul_peak(llm.DTYPES[args.dtype], **(
      dict(n=1024, min_seconds=0.2, repeats=1) if args.quick else {})) * len(devices)
  print(f"{devices[0].device_kind} x{len(devices)} mesh {dict(mesh.shape)} model {args.model} "
        f"({cfg.num_params / 1e6:.1f}M) {args.dtype} batch {args.batch}x{args.seq}: "
        f"{step_s * 1e3:.0f} ms/step, {tokens / step_s:.0f} tokens/s, "
        f"{achieved / 1e9:.1f} GFLOP/s vs matmul peak {peak / 1e9:.1f} GFLOP/s -> "
        f"MFU (achieved / peak): ratio {achieved / peak:.2f}x")


if __name__ == "__main__":
  main()
