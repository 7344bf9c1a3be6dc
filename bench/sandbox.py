"""The `python` tool's cost: calls per second of a trivial call and of an interpreter
start, the OS sandbox (bwrap mode: namespaces, read-only binds, seccomp) vs a plain child
interpreter with the same rlimits (process mode), one process.

    python bench/sandbox.py [--calls 400 --starts 40 --rounds 3]
    python bench/sandbox.py --quick    # `make bench`: 100 calls, 10 starts, 2 rounds

Rounds alternate the two modes (these machines are noisy); each figure is the median
round. A start is the interpreter's launch up to its first answer (`1 + 1`), which the
tool pays once per episode and after each wall-clock kill; a call is one exchange with a
running interpreter (`1 + 1`). The last line: process / bwrap calls per second
(> 1: the sandbox is slower).
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollx.tools import sandbox  # noqa: E402


def starts_per_s(mode: str, n: int) -> float:
  start = time.perf_counter()
  for _ in range(n):
    box = sandbox.PythonSandbox(mode=mode)
    assert box.run_blocking("1 + 1") == "2"
    box.close()
  return n / (time.perf_counter() - start)


def calls_per_s(mode: str, n: int) -> float:
  box = sandbox.PythonSandbox(mode=mode)
  try:
    assert box.run_blocking("1 + 1") == "2"  # started: only calls are timed
    start = time.perf_counter()
    for _ in range(n):
      box.run_blocking("1 + 1")
    return n / (time.perf_counter() - start)
  finally:
    box.close()


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--calls", type=int, default=400)
  p.add_argument("--starts", type=int, default=40)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--quick", action="store_true")
  a = p.parse_args()
  if a.quick:
    a.calls, a.starts, a.rounds = 100, 10, 2
  for mode in sandbox.MODES:
    print(f"{mode}: {sandbox.require(mode)}")
  results = {(m, k): [] for m in sandbox.MODES for k in ("calls", "starts")}
  for _ in range(a.rounds):
    for mode in sandbox.MODES:
      results[mode, "calls"].append(calls_per_s(mode, a.calls))
      results[mode, "starts"].append(starts_per_s(mode, a.starts))
  median = {key: statistics.median(v) for key, v in results.items()}
  print(f"{'mode':8} {'calls/s':>9} {'starts/s':>9}")
  for mode in sandbox.MODES:
    print(f"{mode:8} {median[mode, 'calls']:9.0f} {median[mode, 'starts']:9.1f}")
  print(f"process / bwrap: starts {median['process', 'starts'] / median['bwrap', 'starts']:.2f}x; "
        f"calls ratio {median['process', 'calls'] / median['bwrap', 'calls']:.2f}x")


if __name__ == "__main__":
  main()
