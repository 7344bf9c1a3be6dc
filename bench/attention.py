"""Blocked vs. dense attention: XLA temp memory and time, same process.

    python bench/attention.py [--lengths 1024,2048,4096] [--rows 8] [--block 512]
    python bench/attention.py --quick    # `make bench`: T 512, blocks of 128, 2 rows

Two programs of the shipped default model, each compiled twice: once with one dense
softmax over all T x T scores (`attention_block=0`) and
once with the queries in blocks (`llm.ATTENTION_BLOCK`):
- prefill: a JetStream prefill call (`llm.prefill`) of `--rows` right-padded prompts
  of T tokens (the engine's `prefill_batch` rows);
- train: the gradient of the log-probs of the last 128 (at most T/2) tokens of `--train_rows` rows
  of T tokens, with remat on (the trainer's default), without the optimizer.
Prints, per T, XLA's temp buffer bytes of each compiled program (its
`memory_analysis()`: the scratch the program needs besides inputs and outputs) and
the mean wall time of a call, with the ratios dense / blocked (> 1: blocked is
smaller / faster); the last line: the largest T's ratios.
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rollx import models  # noqa: E402
from rollx.models import llm, logprobs  # noqa: E402


def timed(compiled, args, iters):
  jax.block_until_ready(compiled(*args))  # first call: allocation, page faults
  start = time.perf_counter()
  for _ in range(iters):
    jax.block_until_ready(compiled(*args))
  return (time.perf_counter() - start) / iters


def programs(loaded, block, rows, train_rows, t):
  model = llm.make_model(loaded.config, attention_block=block)
  train_model = llm.make_model(loaded.config, remat=True, attention_block=block)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(3, loaded.config.vocab_size, (rows, t)), jnp.int32)
  lengths = jnp.asarray(rng.integers(t // 2, t + 1, rows), jnp.int32)
  prefill = jax.jit(llm.prefill, static_argnums=0).lower(model, loaded.params, tokens, lengths)

  train_tokens = jnp.asarray(rng.integers(3, loaded.config.vocab_size, (train_rows, t)), jnp.int32)
  scored = min(128, t // 2)
  score_bk = jnp.broadcast_to(jnp.arange(t - scored, t), (train_rows, scored))

  def loss(params):
    logp, _ = logprobs.compute_logprobs(train_model, params, train_tokens, score_bk=score_bk)
    return -jnp.sum(logp)

  train = jax.jit(jax.grad(loss)).lower(loaded.params)
  return {"prefill": (prefill.compile(), (loaded.params, tokens, lengths)),
          "train": (train.compile(), (loaded.params,))}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--lengths", default="1024,2048,4096")
  parser.add_argument("--rows", type=int, default=8, help="prefill rows per call")
  parser.add_argument("--train_rows", type=int, default=2)
  parser.add_argument("--block", type=int, default=llm.ATTENTION_BLOCK)
  parser.add_argument("--iters", type=int, default=3)
  parser.add_argument("--quick", action="store_true", help="T 512, block 128, 2 rows (make bench)")
  args = parser.parse_args()
  if args.quick:
    args.lengths, args.rows, args.train_rows, args.block, args.iters = "512", 2, 1, 128, 1
  loaded = models.load_model(models.DEFAULT_MODEL_DIR, remat=False)
  print(f"default model ({loaded.config.num_params / 1e6:.2f}M params), {jax.devices()[0].platform}, "
        f"prefill {args.rows} rows, train {args.train_rows} rows, block {args.block}")
  print(f"{'program':8} {'T':>5} {'dense MB':>9} {'blocked MB':>10} {'mem ratio':>9} "
        f"{'dense s':>8} {'blocked s':>9} {'time ratio':>10}")
  ratios = {}
  for t in [int(x) for x in args.lengths.split(",")]:
    dense = programs(loaded, 0, args.rows, args.train_rows, t)
    blocked = programs(loaded, args.block, args.rows, args.train_rows, t)
    for name in ("prefill", "train"):
      (cd, ad), (cb, ab) = dense[name], blocked[name]
      md = cd.memory_analysis().temp_size_in_bytes / 2**20
      mb = cb.memory_analysis().temp_size_in_bytes / 2**20
      td, tb = timed(cd, ad, args.iters), timed(cb, ab, args.iters)
      ratios[name] = (md / mb, td / tb)
      print(f"{name:8} {t:5d} {md:9.0f} {mb:10.0f} {md / mb:8.2f}x {td:8.3f} {tb:9.3f} "
            f"{td / tb:9.2f}x", flush=True)
  print(f"T {t}, dense / blocked: train temp memory {ratios['train'][0]:.2f}x, time "
        f"{ratios['train'][1]:.2f}x; prefill time {ratios['prefill'][1]:.2f}x, temp memory "
        f"ratio {ratios['prefill'][0]:.2f}x")


if __name__ == "__main__":
  main()
