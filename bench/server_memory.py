"""Peak memory (RSS) of a config's rollout server under its longest requests.

    python bench/server_memory.py [--configs frozenlake,sokoban:multiturn,...] [--turns 4]
    python bench/server_memory.py --quick    # `make bench`: frozenlake, 2 turns

For each config (default: every shipped one), `python -m rollx.serve --config=...` runs
in a child process, twice: started as training starts its processes (rollx.hostmem's
settings, which a server switches to its own at start-up) and with ROLLX_MALLOC_TUNING=0
(glibc's defaults: the baseline). Its load is the config's worst case:
`max_concurrent_decodes` conversations at once, each starting at half the server's
prefill length and growing turn by turn (`--turns`) to the longest prompt the server
takes, each turn `max_new_tokens` long, so full-bucket prefills and continuations onto
cached keys/values both run. The figure is the child's peak RSS (the kernel's VmHWM) and
the ratio of the two runs.
"""

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from rollx import checks, config as rollx_config, hostmem, models  # noqa: E402
from rollx.models import hf  # noqa: E402
from rollx.serving.client import RolloutClient  # noqa: E402

SHIPPED = ("frozenlake", "frozenlake:multiturn", "simple_sokoban", "sokoban",
           "sokoban:multiturn", "webshop", "tool_arithmetic")


def kib(pid: int, field: str) -> int:
  """A /proc/<pid>/status field (VmRSS, VmHWM) in KiB."""
  with open(f"/proc/{pid}/status") as f:
    return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


async def load(address: str, config, turns: int, vocab: int) -> int:
  """The config's longest conversations, all slots at once; returns tokens generated."""
  s, g = config.actor_infer.strategy_args, config.actor_infer.generating_args
  new = int(g.max_new_tokens)
  longest = min(s.max_prefill_length, s.max_cache_length - new)
  start = max(1, longest // 2)
  step = max(1, (longest - start) // max(1, turns))
  rng = np.random.default_rng(0)
  client = RolloutClient([address])

  async def conversation(i):
    ids, made = rng.integers(3, vocab, start).tolist(), 0
    for t in range(turns + 1):
      gen = await client.generate(f"m{i}t{t}", ids[:longest], new, trajectory_id=f"m{i}")
      made += len(gen.token_ids)
      ids += gen.token_ids + rng.integers(3, vocab, step).tolist()
    return made

  made = await asyncio.gather(*(conversation(i) for i in range(s.max_concurrent_decodes)))
  await client.close()
  return sum(made)


def measure(name: str, tuned: bool, turns: int) -> tuple:
  """(peak RSS GiB, RSS after start-up GiB, seconds) of one server run."""
  stem, sep, layout = name.partition(":")
  arg = os.path.join(ROOT, "configs", f"{stem}.py") + (f":{layout}" if sep else "")
  config = checks.validate(rollx_config.load_file(arg))
  env = dict(os.environ, ROLLX_MALLOC_TUNING="1" if tuned else "0")
  env.pop("GLIBC_TUNABLES", None)
  env = (hostmem.tuned_environ(env) or env) if tuned else env
  child = subprocess.Popen([sys.executable, "-m", "rollx.serve", f"--config={arg}"], cwd=ROOT,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    line = child.stdout.readline()
    if not line.startswith("serving on "):
      raise RuntimeError(f"{name}: the server did not start ({line!r})")
    started = kib(child.pid, "VmRSS")
    vocab = hf.load_model_config(models.resolve_model_dir(config.pretrain)).vocab_size
    t0 = time.perf_counter()
    asyncio.run(load(line.split()[-1], config, turns, vocab))
    seconds = time.perf_counter() - t0
    peak = kib(child.pid, "VmHWM")
  finally:
    child.terminate()
    child.wait(timeout=30)
  return peak / 2**20, started / 2**20, seconds


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--configs", default=",".join(SHIPPED))
  p.add_argument("--turns", type=int, default=4)
  p.add_argument("--quick", action="store_true", help="frozenlake, 2 turns (make bench)")
  args = p.parse_args()
  if args.quick:
    args.configs, args.turns = "frozenlake", 2
  for name in args.configs.split(","):
    base_peak, base_start, base_s = measure(name, False, args.turns)
    peak, start, seconds = measure(name, True, args.turns)
    print(f"configs/{name}: server peak RSS {peak:.2f} GiB (after start-up {start:.2f}, "
          f"load {seconds:.0f} s) as training starts it; {base_peak:.2f} GiB "
          f"({base_start:.2f}, {base_s:.0f} s) with glibc's defaults: ratio {peak / base_peak:.2f}x",
          flush=True)


if __name__ == "__main__":
  main()
