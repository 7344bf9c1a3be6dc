"""bench/frozenlake_policies.py: the reference policies' moves on hand-built maps, the
failure classifier, a greedy play of the shipped default model on a few levels, and the
Sokoban probe's exact solution distances and labels."""

import random

import numpy as np

from bench import frozenlake_policies as fp
from configs import frozenlake

# S at (1,1), G at (3,1), a hole right below S: towards G is Down, into the hole.
MAP = ["FFFF", "FSFF", "FHFF", "FGFF"]


def test_reference_moves_on_a_hand_built_map():
  rng = random.Random(0)
  assert fp.toward_goal(MAP, (1, 1), rng) == "Down"  # holes ignored
  assert fp.safe_toward_goal(MAP, (1, 1), rng) == "Left"  # no safe move shortens: Left first
  assert fp.shortest_path(MAP, (1, 1), rng) in ("Left", "Right")  # around the hole: 4 moves
  assert fp.shortest_path(MAP, (2, 2), rng) == "Down"
  assert fp.toward_goal(MAP, (0, 0), rng) == "Down"  # order: Left, Down, Right, Up


def test_failure_kinds():
  assert fp.failure_kind(MAP, ["Down"], "terminated") == (
      "hole while moving towards G, no safe move towards G")
  # back at S after Right, Left: only Down shortens, and it is the hole
  assert fp.failure_kind(MAP, ["Right", "Left", "Down"], "terminated") == (
      "hole while moving towards G, no safe move towards G")
  free = ["FFFF", "FSHF", "FFFF", "FGFF"]
  assert fp.failure_kind(free, ["Right"], "terminated") == "hole while moving away from G"
  holes = ["FFFF", "FSFF", "FHHF", "FGFF"]
  assert fp.failure_kind(holes, ["Right", "Down"], "terminated") == (
      "hole while moving towards G, a safe move towards G at hand")
  assert fp.failure_kind(MAP, ["Up"] * 10, "truncated") == "out of moves"


def test_levels_and_policies_on_the_validation_stream():
  config = frozenlake.get_config()
  config.val_env_manager.num_env_groups = 16
  seeds = fp.validation_seeds(config, 2)
  assert len(seeds) == len(set(seeds)) == 32
  success = {name: fp.play_reference(config, policy, seeds) for name, policy in fp.REFERENCE.items()}
  assert success["shortest_path"] == 1.0  # every generated map is solvable in max_steps
  assert success["random"] < success["toward_goal"] <= success["safe_toward_goal"] <= 1.0
  rate, kinds = fp.play_model(config, None, seeds[:4])  # the shipped default model
  assert sum(kinds.values()) == 4 and rate == kinds["success"] / 4


def test_probe_shortest_moves_and_labels():
  from bench import frozenlake_probe as probe
  from rollx.models import hf, make_default
  assert fp.shortest_moves(MAP, (1, 1)) == ["Left", "Right"]  # around the hole, both ways
  assert fp.shortest_moves(MAP, (2, 2)) == ["Down"]  # Left is the hole
  assert fp.shortest_moves(MAP, (3, 3)) == ["Left"]
  assert fp.hole_moves(MAP, (1, 1)) == ["Down"] and fp.hole_moves(MAP, (2, 2)) == ["Left"]
  config = frozenlake.get_config()
  tokenizer = hf.load_tokenizer(make_default.DEFAULT_DIR)
  ids, seg, moves, traps, holes = probe.labelled_states(config, tokenizer, 64, seed=0)
  assert ids.shape[0] == seg.shape[0] == len(moves) == len(traps) == len(holes) == 64
  for row, s, (at, best) in zip(ids, seg, moves):
    # the answer's move is one of the shortest-path moves, right after `<answer>`
    assert tokenizer.decode(row[at - 1:s.sum()]).startswith("<answer>")
    assert tokenizer.decode([row[at]]) in best
  assert 0 < traps.mean() < 0.5  # some states are traps, most are not
  for trap, hole_moves, (_, best) in zip(traps, holes, moves):
    assert not set(hole_moves) & set(best)  # a shortest path never steps into a hole
    assert not trap or hole_moves  # a trap has a hole next to the player


def test_sokoban_probe_distances_agree_with_the_independent_solver():
  from bench import sokoban_probe as sp
  from configs import simple_sokoban
  from envs import sokoban
  from rollx.models import hf, make_default
  from tests import sokoban_solver
  for seed in range(20):
    level = sokoban.generate_level((6, 6), 1, 30, np.random.default_rng(seed))
    dist = sp.goal_distances(level)
    start = (level.player, level.boxes)
    assert dist[start] == len(sokoban_solver.solve(level))
    state = start  # following any shortest move lowers the distance by one, to a solution
    while dist[state]:
      best = sp.shortest_moves(level, state, dist)
      assert best and set(best) <= set(sokoban.ACTION_DELTAS)
      state = sokoban.move(level, *state, best[-1])[:2]
    assert state[1] == level.targets
  # a box pushed into a corner off its target has no solution: no labels there
  corner = sokoban.Level(4, 4, frozenset({0, 1, 2, 3, 4, 7, 8, 11, 12, 13, 14, 15}),
                         frozenset({10}), 9, frozenset({5}))
  assert sp.shortest_moves(corner, (corner.player, corner.boxes), sp.goal_distances(corner)) == []
  config = simple_sokoban.get_config()
  tokenizer = hf.load_tokenizer(make_default.DEFAULT_DIR)
  ids, seg, moves, depth = sp.labelled_states(config, tokenizer, 64, seed=0)
  assert ids.shape[0] == seg.shape[0] == len(moves) == len(depth) == 64 and depth.min() >= 1
  for row, s, (at, best) in zip(ids, seg, moves):
    assert tokenizer.decode(row[at - 1:s.sum()]).startswith("<answer>")
    assert tokenizer.decode([row[at]]) in best
