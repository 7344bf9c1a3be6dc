"""LM head at the response positions only vs on every position, same process.

    python bench/scored_head.py                     # default model, FrozenLake-like rows
    python bench/scored_head.py --vocab 151936 --rows 8   # a Qwen-sized vocabulary
    python bench/scored_head.py --quick             # `make bench`: 8 rows, 2 rounds

Rows are packed like configs/frozenlake.py's: `--rows` x 160 tokens, five 32-token
samples per row whose last 4 tokens are the response. The baseline computes the
logits, log-softmax and entropy at every position (what the trainer did before
`compute_logprobs(score_bk=...)`); the other at the response positions
(`packing.score_positions`). Both the log-prob forward (old / reference log-probs)
and the policy-gradient step's gradient are timed, rounds alternated; the figure is
the ratio baseline / scored (> 1: the scored head is faster). The two are checked to
agree first.
"""

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rollx import models  # noqa: E402
from rollx.models import llm, logprobs  # noqa: E402
from rollx.trainer.packing import score_positions  # noqa: E402

WIDTH, SAMPLE, RESPONSE = 160, 32, 4


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--vocab", type=int, default=None, help="default: the default model's")
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument("--quick", action="store_true", help="8 rows, 2 rounds (make bench)")
  args = p.parse_args()
  if args.quick:
    args.rows, args.rounds = 8, 2

  loaded = models.load_model(None)
  cfg, params = loaded.config, loaded.params
  if args.vocab:
    cfg = dataclasses.replace(cfg, vocab_size=args.vocab)
    params = llm.init_params(llm.make_model(cfg), jax.random.PRNGKey(0))
  model = llm.make_model(cfg)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(3, cfg.vocab_size, (args.rows, WIDTH)), jnp.int32)
  seg = jnp.asarray(np.repeat(np.arange(1, WIDTH // SAMPLE + 1), SAMPLE)[None]
                    .repeat(args.rows, 0), jnp.int32)
  mask = np.zeros((args.rows, WIDTH), np.float32)
  for s in range(WIDTH // SAMPLE):
    mask[:, (s + 1) * SAMPLE - RESPONSE:(s + 1) * SAMPLE] = 1
  score = jnp.asarray(score_positions(mask))
  adv = jnp.asarray(rng.standard_normal(mask.shape), jnp.float32)
  mask = jnp.asarray(mask)

  def loss(p, score_bk):
    logp, ent = logprobs.compute_logprobs(model, p, ids, seg, score_bk)
    return -jnp.sum((logp * adv + 0.01 * ent) * mask) / jnp.sum(mask)

  fns = {
      "log-prob forward": (jax.jit(lambda p: logprobs.compute_logprobs(model, p, ids, seg)[0]),
                           jax.jit(lambda p: logprobs.compute_logprobs(model, p, ids, seg,
                                                                       score)[0])),
      "gradient": (jax.jit(jax.grad(lambda p: loss(p, None))),
                   jax.jit(jax.grad(lambda p: loss(p, score)))),
  }
  full, scored = (np.asarray(f(params)) for f in fns["log-prob forward"])
  on = np.asarray(mask) > 0
  err = float(np.abs(full[on] - scored[on]).max())
  assert err < 1e-4, f"scored log-probs differ from the full head's by {err}"
  print(f"{jax.devices()[0].device_kind}: {args.rows} x {WIDTH} tokens, "
        f"{int(on.sum())} response tokens, vocab {cfg.vocab_size} (max |dlogp| {err:.1e})")
  for name, (base, new) in fns.items():
    jax.block_until_ready(base(params))
    jax.block_until_ready(new(params))
    times = ([], [])
    for _ in range(args.rounds):
      for i, f in enumerate((base, new)):
        start = time.perf_counter()
        jax.block_until_ready(f(params))
        times[i].append(time.perf_counter() - start)
    b, s = np.median(times[0]), np.median(times[1])
    print(f"{name}: every position {b * 1e3:.1f} ms, response positions {s * 1e3:.1f} ms: "
          f"ratio {b / s:.2f}x")


if __name__ == "__main__":
  main()
