"""Sokoban level generation speed: reverse-play generator vs. rejection sampling.

    python bench/sokoban_gen.py [--levels 500]
    python bench/sokoban_gen.py --quick    # `make bench`: 50 levels

Both make solvable, non-trivial levels of the same size in the same process:
- rollx: carve a room, put boxes on targets, BFS over reverse play (solvable by
  construction);
- baseline: carve the same kind of room, drop boxes/targets/player at random, keep
  the level if a forward BFS solver solves it (what one does without reverse play).
Prints ms per level for each and the speed-up ratio, plus the ratio to the 50 ms budget.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs import sokoban  # noqa: E402
from envs import sokoban_solver  # noqa: E402


def rejection_level(dim_room, num_boxes, rng):
  h, w = dim_room
  while True:
    floor = sokoban._carve_room(h, w, rng)
    cells = np.flatnonzero(floor.ravel())
    if len(cells) < 2 * num_boxes + 1:
      continue
    picks = [int(x) for x in rng.choice(cells, size=2 * num_boxes + 1, replace=False)]
    level = sokoban.Level(h, w, frozenset(int(i) for i in np.flatnonzero(~floor.ravel())),
                          frozenset(picks[:num_boxes]), picks[-1],
                          frozenset(picks[num_boxes:2 * num_boxes]))
    if sokoban_solver.solve(level, max_depth=30) is not None:
      return level


def timed(fn, n):
  start = time.perf_counter()
  for _ in range(n):
    fn()
  return (time.perf_counter() - start) / n * 1000


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--levels", type=int, default=500)
  parser.add_argument("--quick", action="store_true", help="50 levels (make bench)")
  args = parser.parse_args()
  if args.quick:
    args.levels = 50
  for name, dims, boxes, depth in [("SimpleSokoban", (6, 6), 1, 30),
                                   ("LargerSokoban", (10, 10), 2, 10)]:
    rng = np.random.default_rng(0)
    ours = timed(lambda: sokoban.generate_level(dims, boxes, depth, rng), args.levels)
    n_base = max(args.levels // 10, 10)
    base = timed(lambda: rejection_level(dims, boxes, rng), n_base)
    print(f"{name} {dims[0]}x{dims[1]} {boxes} box(es): rollx {ours:.2f} ms/level, "
          f"rejection-sampling baseline {base:.2f} ms/level ({50 / ours:.0f}x under the 50 ms "
          f"budget): ratio {base / ours:.1f}x")


if __name__ == "__main__":
  main()
