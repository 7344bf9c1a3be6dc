"""Forward and train-step tokens/s: rollx (JAX) vs. transformers (torch CPU), same run.

    python bench/model.py [--configs default,qwen2.5-0.5b] [--batch 8 --seq 128]
    python bench/model.py --quick    # `make bench`: the default model, 4 x 64 tokens

For each config, both implementations get the same weights (ours are loaded from
the HF directory torch writes) and the same batch; the train step is next-token
cross-entropy + AdamW on every parameter, fp32. Prints tokens/s for each and the
ratio rollx / transformers (> 1 means rollx is faster). Runs on whatever device
JAX sees (CPU here; torch always on CPU).
"""

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rollx import models  # noqa: E402
from rollx.models import llm, logprobs  # noqa: E402

SHAPES = {
    "default": None,  # the shipped directory
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         tie_word_embeddings=True, max_position_embeddings=4096),
}


def timeit(fn, iters):
  fn()  # warm-up / compile
  start = time.perf_counter()
  for _ in range(iters):
    fn()
  return (time.perf_counter() - start) / iters


def bench(name, batch, seq, iters):
  tmp = tempfile.mkdtemp()
  if SHAPES[name] is None:
    model_dir = models.DEFAULT_MODEL_DIR
  else:
    cfg = transformers.Qwen2Config(**SHAPES[name])
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp)
    model_dir = tmp
  tokens = batch * seq
  loaded = models.load_model(model_dir, remat=False)
  ids = jnp.asarray(np.random.default_rng(0).integers(0, loaded.config.vocab_size, (batch, seq)))

  fwd = jax.jit(lambda p, x: llm.forward(loaded.model, p, x))
  t_fwd = timeit(lambda: fwd(loaded.params, ids).block_until_ready(), iters)

  opt = optax.adamw(1e-5)

  def loss_fn(p):
    return -logprobs.compute_logprobs(loaded.model, p, ids)[0][:, 1:].mean()

  @jax.jit
  def train_step(p, s):
    loss, g = jax.value_and_grad(loss_fn)(p)
    updates, s = opt.update(g, s, p)
    return optax.apply_updates(p, updates), s, loss

  state = [loaded.params, opt.init(loaded.params)]

  def run_step():
    state[0], state[1], loss = train_step(*state)
    loss.block_until_ready()

  t_train = timeit(run_step, iters)
  state.clear()  # free the JAX copies before torch loads its own
  loaded = None

  ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
  tids = torch.tensor(np.asarray(ids), dtype=torch.long)
  ref.eval()
  with torch.no_grad():
    t_fwd_ref = timeit(lambda: ref(tids).logits, iters)
  ref.train()
  topt = torch.optim.AdamW(ref.parameters(), lr=1e-5)

  def ref_step():
    topt.zero_grad()
    out = ref(tids, labels=tids)
    out.loss.backward()
    topt.step()

  t_train_ref = timeit(ref_step, iters)
  print(f"{name:>13} batch {batch}x{seq}: forward rollx {tokens / t_fwd:9.0f} tok/s, "
        f"transformers {tokens / t_fwd_ref:9.0f} tok/s, ratio {t_fwd_ref / t_fwd:.2f}x | "
        f"train step rollx {tokens / t_train:8.0f} tok/s, transformers "
        f"{tokens / t_train_ref:8.0f} tok/s, ratio {t_train_ref / t_train:.2f}x")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--configs", default="default,qwen2.5-0.5b")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--iters", type=int, default=3)
  parser.add_argument("--quick", action="store_true", help="default model, 4 x 64 tokens, 2 "
                      "iterations (make bench)")
  args = parser.parse_args()
  if args.quick:
    args.configs, args.batch, args.seq, args.iters = "default", 4, 64, 2
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; torch {torch.__version__} "
        f"CPU threads {torch.get_num_threads()}")
  for name in args.configs.split(","):
    batch = args.batch if name == "default" else max(1, args.batch // 4)
    bench(name, batch, args.seq, args.iters)


if __name__ == "__main__":
  main()
