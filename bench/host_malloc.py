"""Train-step time with glibc's malloc as rollx.hostmem sets it vs. glibc's default for
large blocks, one process.

    python bench/host_malloc.py [--rows 64 --seq 160 --rounds 6]
    python bench/host_malloc.py --quick    # `make bench`: 16 x 160 tokens, 2 rounds

The default model's gradient step (log-prob loss) on a packed batch, jitted once.
Rounds alternate the two settings in the same process (these machines are noisy):
- baseline: large blocks from mmap, unmapped on free, and the heap top trimmed past
  128 KiB (glibc's defaults for blocks above its mmap threshold, which XLA:CPU's
  per-call temporaries are);
- tuned: `mmap_max=0` and a high `trim_threshold`, so freed blocks stay in the heap
  (rollx.hostmem).
The process runs with `arena_max=1` throughout (it re-executes itself with it):
that is what lets `mallopt` switch the main heap's behaviour for XLA's threads.
Prints median step times, minor page faults per step and the ratio.
"""

import argparse
import ctypes
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollx import hostmem  # noqa: E402

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
# rollx's arena setting; the other two tunables are what this bench toggles at run time
ARENA = next(t for t in hostmem.TUNABLES if t.startswith("glibc.malloc.arena_max="))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--seq", type=int, default=160)
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument("--steps", type=int, default=5, help="steps per round")
  p.add_argument("--quick", action="store_true", help="16 rows, 2 rounds of 2 steps (make bench)")
  args = p.parse_args()
  if args.quick:
    args.rows, args.rounds, args.steps = 16, 2, 2
  if ARENA not in os.environ.get("GLIBC_TUNABLES", ""):
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              dict(os.environ, GLIBC_TUNABLES=ARENA))

  import jax
  import jax.numpy as jnp
  import numpy as np
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from rollx import models
  from rollx.models import logprobs

  libc = ctypes.CDLL("libc.so.6")
  loaded = models.load_model(None)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(3, 600, (args.rows, args.seq)), jnp.int32)
  per_row = max(1, args.seq // 32)
  seg = jnp.asarray(np.repeat(np.arange(1, per_row + 1), args.seq // per_row)[None]
                    .repeat(args.rows, 0), jnp.int32)
  grad = jax.jit(jax.grad(lambda p, i, s: logprobs.compute_logprobs(
      loaded.model, p, i, s)[0].sum()))
  jax.block_until_ready(grad(loaded.params, ids, seg))

  times = {"baseline": [], "tuned": []}
  faults = {"baseline": [], "tuned": []}
  for _ in range(args.rounds):
    for name, mmap_max, trim in (("baseline", 65536, 128 * 1024), ("tuned", 0, 2**31 - 1)):
      libc.mallopt(M_MMAP_MAX, mmap_max)
      libc.mallopt(M_TRIM_THRESHOLD, trim)
      jax.block_until_ready(grad(loaded.params, ids, seg))  # settle the heap
      for _ in range(args.steps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        jax.block_until_ready(grad(loaded.params, ids, seg))
        times[name].append(time.perf_counter() - t0)
        faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
  base, tuned = (float(np.median(times[k])) for k in ("baseline", "tuned"))
  print(f"train step (grad), default model, {args.rows}x{args.seq} tokens, {os.cpu_count()} CPUs: "
        f"baseline {base * 1e3:.0f} ms ({np.median(faults['baseline']):.0f} page faults), "
        f"tuned {tuned * 1e3:.0f} ms ({np.median(faults['tuned']):.0f} page faults): "
        f"ratio {base / tuned:.2f}x")


if __name__ == "__main__":
  main()
