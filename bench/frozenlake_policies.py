"""FrozenLake: hand-written reference policies on the validation levels, and how a
trained policy fails on them.

    python bench/frozenlake_policies.py --config=configs/frozenlake.py
    python bench/frozenlake_policies.py --config=configs/frozenlake.py --model_dir=OUT/export

Plays the levels validation plays (the "val" level stream of `config.seed`, all
`val_env_manager.num_env_groups` groups, generations 0..--generations-1) through the
real env, with:
- random: a uniformly random move every step (the baseline of the ratios);
- toward_goal: the first move (Left, Down, Right, Up) that shortens the Manhattan
  distance to G, holes ignored;
- safe_toward_goal: of the in-bounds moves not into a hole, one with the least
  distance to G (a one-step hole check);
- shortest_path: the first move of a shortest path over frozen cells (the ceiling).
They are what a curve's level means: a policy that has learned "walk towards G" and
no more sits at toward_goal's success. With `--model_dir` an exported policy (an HF
directory, e.g. `output_dir/export`) plays the same levels greedily through the
rollouts' EnvManager (`rollx.play.local_manager`), and each failure is sorted by its
last move: into a hole while moving towards G with a safe move towards G at hand,
into a hole otherwise, or out of moves. Prints success per policy and its ratio to
random.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import sys
from typing import Callable, Dict, List, Optional, Tuple

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollx import cli  # noqa: E402  (defines --config)

FLAGS = flags.FLAGS
TAG = "FrozenLake"
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
Cell = Tuple[int, int]
Policy = Callable[[List[str], Cell, random.Random], str]


def _find(desc: List[str], tile: str) -> Cell:
  return next((r, c) for r, row in enumerate(desc) for c, t in enumerate(row) if t == tile)


def _dist(a: Cell, b: Cell) -> int:
  return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _inside(desc: List[str], cell: Cell) -> bool:
  return 0 <= cell[0] < len(desc) and 0 <= cell[1] < len(desc[0])


def _after(desc: List[str], pos: Cell, move: str) -> Cell:
  """Where `move` leads (a move off the board stays put, as in gymnasium)."""
  cell = (pos[0] + MOVES[move][0], pos[1] + MOVES[move][1])
  return cell if _inside(desc, cell) else pos


def hole_moves(desc: List[str], pos: Cell) -> List[str]:
  """The moves from `pos` that step into a hole."""
  return [m for m in MOVES if desc[_after(desc, pos, m)[0]][_after(desc, pos, m)[1]] == "H"]


def random_move(desc, pos, rng):
  return rng.choice(list(MOVES))


def toward_goal(desc, pos, rng):
  goal = _find(desc, "G")
  return next((m for m in MOVES if _dist(_after(desc, pos, m), goal) < _dist(pos, goal)), "Left")


def safe_toward_goal(desc, pos, rng):
  goal = _find(desc, "G")
  safe = [(_dist(_after(desc, pos, m), goal), i, m) for i, m in enumerate(MOVES)
          if desc[_after(desc, pos, m)[0]][_after(desc, pos, m)[1]] != "H"]
  return min(safe)[2] if safe else "Left"


def shortest_moves(desc: List[str], pos: Cell) -> List[str]:
  """Every move that starts a shortest path from `pos` to G over frozen cells."""
  goal = _find(desc, "G")
  dist, queue = {goal: 0}, collections.deque([goal])
  while queue:  # moves are reversible (a wall bump stays put): BFS from G
    cell = queue.popleft()
    for m in MOVES:
      nxt = _after(desc, cell, m)
      if nxt not in dist and desc[nxt[0]][nxt[1]] != "H":
        dist[nxt] = dist[cell] + 1
        queue.append(nxt)
  if pos not in dist:
    return []  # no path (generate_map never makes one)
  return [m for m in MOVES if dist.get(_after(desc, pos, m), 1 << 30) == dist[pos] - 1]


def shortest_path(desc, pos, rng):
  return (shortest_moves(desc, pos) or ["Left"])[0]


REFERENCE: Dict[str, Policy] = {"random": random_move, "toward_goal": toward_goal,
                                "safe_toward_goal": safe_toward_goal,
                                "shortest_path": shortest_path}


def validation_seeds(config, generations: int, tag: str = TAG) -> List[int]:
  """The level seeds the validation rollouts of `tag` play, generation by generation."""
  from rollx.rollout.scheduler import level_seed
  return [level_seed(int(config.seed), "val", tag, g, n) for n in range(generations)
          for g in range(int(config.val_env_manager.num_env_groups))]


def play_levels(config, tag: str, choose, seeds: List[int]) -> float:
  """Success rate on the levels of `choose(env, rng) -> move`, through the real env of
  `custom_envs[tag]` (its text answers)."""
  import envs
  entry = config.custom_envs[tag]
  env = envs.make_env(entry.env_type, entry.env_config.to_dict())
  rng, wins = random.Random(0), 0
  for seed in seeds:
    env.reset(seed=seed)
    while True:
      _, _, terminated, truncated, info = env.step(f"<answer>{choose(env, rng)}</answer>")
      if terminated or truncated:
        wins += bool(info["success"])
        break
  return wins / len(seeds)


def play_reference(config, policy: Policy, seeds: List[int]) -> float:
  """Success rate of `policy` on the FrozenLake levels."""
  return play_levels(config, TAG, lambda env, rng: policy(env.desc, env.position, rng), seeds)


def failure_kind(desc: List[str], moves: List[str], finish: str) -> str:
  """Why an episode that did not reach G ended, from its map and its (valid) moves."""
  if finish != "terminated" or not moves:
    return "out of moves"
  pos, goal = _find(desc, "S"), _find(desc, "G")
  for move in moves[:-1]:
    pos = _after(desc, pos, move)
  towards = lambda m: _dist(_after(desc, pos, m), goal) < _dist(pos, goal)
  safe_towards = any(towards(m) and desc[_after(desc, pos, m)[0]][_after(desc, pos, m)[1]] != "H"
                     for m in MOVES)
  if towards(moves[-1]):
    return ("hole while moving towards G, a safe move towards G at hand" if safe_towards
            else "hole while moving towards G, no safe move towards G")
  return "hole while moving away from G"


def model_episodes(config, model_dir: str, seeds: List[int], tag: str = TAG):
  """The exported policy's episodes on the levels of `tag`, decoded in this process with
  the validation sampling: yields (manager, trajectory), the manager's env still at the
  episode's end."""
  from rollx import play
  from rollx.rollout.types import Ticket
  config.pretrain = model_dir
  manager = play.local_manager(config, tag, val=True)
  for i, seed in enumerate(seeds):
    yield manager, asyncio.run(manager.run_episode(Ticket(0, tag, 0, i, seed)))


def play_model(config, model_dir: str, seeds: List[int]) -> Tuple[float, collections.Counter]:
  """Greedy (val sampling) success of the exported policy, and its failures by kind."""
  kinds = collections.Counter()
  for manager, traj in model_episodes(config, model_dir, seeds):
    if traj.success:
      kinds["success"] += 1
      continue
    moves = [t["action"] for t in traj.transcript if t["valid"]]
    kinds[failure_kind(list(manager.env.desc), moves, traj.finish)] += 1
  return kinds["success"] / len(seeds), kinds


def main(argv):
  del argv
  config = cli.load_config()
  if TAG not in config.custom_envs:
    cli.fail(f"--config: no custom_envs.{TAG} entry; this bench plays FrozenLake")
  seeds = validation_seeds(config, FLAGS.generations)
  results = {name: play_reference(config, policy, seeds) for name, policy in REFERENCE.items()}
  base = results["random"]
  print(f"{len(seeds)} validation levels (seed {config.seed}, {FLAGS.generations} generations "
        f"of {config.val_env_manager.num_env_groups} groups)")
  for name, success in results.items():
    print(f"{name:18s} success {success:.3f}  ({success / max(base, 1e-9):.1f}x random)")
  if FLAGS.model_dir:
    success, kinds = play_model(config, FLAGS.model_dir, seeds)
    print(f"{'model (greedy)':18s} success {success:.3f}  ({success / max(base, 1e-9):.1f}x "
          f"random)  {FLAGS.model_dir}")
    for kind, n in kinds.most_common():
      if kind != "success":
        print(f"  failures: {n:4d}  {kind}")


if __name__ == "__main__":
  flags.DEFINE_integer("generations", 4, "validation generations (each: every val group once)")
  flags.DEFINE_string("model_dir", None, "an exported policy (HF directory) to play greedily")
  app.run(main, flags_parser=cli.parse_flags)
