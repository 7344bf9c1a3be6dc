import gymnasium
import numpy as np
import pytest

import envs
from envs import sokoban
from tests import sokoban_solver


def test_500_simple_levels_are_solvable_within_search_depth_and_by_replay():
  env = envs.make_env("Sokoban", sokoban.VARIANTS["SimpleSokoban"] | dict(max_steps=100))
  for seed in range(500):
    env.reset(seed=seed)
    level = env.level
    assert len(level.boxes) == 1 and level.boxes != level.targets
    solution = sokoban_solver.solve(level)
    assert solution is not None, f"seed {seed} unsolvable"
    assert len(solution) <= env.config.search_depth
    total = 0.0
    for action in solution:  # the env's own dynamics agree with the solver
      _, reward, terminated, _, info = env.step(f"<answer>{action}</answer>")
      total += reward
    assert terminated and info["success"]
    assert reward == pytest.approx(-0.1 + 1.0 + 10.0)


def test_larger_levels_are_solvable():
  cfg = sokoban.VARIANTS["LargerSokoban"]
  for seed in range(20):
    level = sokoban.generate_level(cfg["dim_room"], 2, cfg["search_depth"],
                                   np.random.default_rng(seed))
    assert len(level.boxes) == 2
    solution = sokoban_solver.solve(level, max_depth=cfg["search_depth"])
    assert solution is not None and len(solution) <= cfg["search_depth"]


def _env_with(rows):
  """A Sokoban env set to a hand-drawn level (# wall, _ floor, O target, X box, P player)."""
  env = envs.make_env("Sokoban", dict(max_steps=20))
  env.reset(seed=0)
  w = len(rows[0])
  cells = {ch: {r * w + c for r, row in enumerate(rows) for c, x in enumerate(row) if x == ch}
           for ch in "#OXP√S"}
  targets = cells["O"] | cells["√"] | cells["S"]
  env.level = sokoban.Level(len(rows), w, frozenset(cells["#"]), frozenset(targets),
                            next(iter(cells["P"] | cells["S"])),
                            frozenset(cells["X"] | cells["√"]))
  env.player, env.boxes = env.level.player, env.level.boxes
  return env


def test_reward_table():
  env = _env_with(["######",
                   "#PX_O#",
                   "#__XO#",
                   "######"])
  step = lambda a: env.step(f"<answer>{a}</answer>")
  _, r, _, _, info = step("Up")  # bump into a wall: step cost, no move
  assert r == pytest.approx(-0.1) and env.player == 7
  assert info["action_is_valid"] and not info["action_is_effective"]
  _, r, term, _, info = step("Right")  # push box 1 onto floor
  assert r == pytest.approx(-0.1) and not term and info["action_is_valid"]
  assert info["action_is_effective"]
  _, r, *_ = step("Right")  # push box 1 onto the target
  assert r == pytest.approx(-0.1 + 1.0)
  _, r, _, _, info = step("Right")  # box blocked by the wall: no move
  assert r == pytest.approx(-0.1) and env.player == 9 and not info["action_is_effective"]
  assert step("nothing")[1] == pytest.approx(-0.15)  # invalid action: penalty, no move
  assert step("Down")[1] == pytest.approx(-0.1) and env.player == 9  # box 2 into a wall
  step("Left"), step("Down")  # walk to box 2's left
  assert env.render_text().splitlines()[2] == "#_PXO#"
  obs, r, term, trunc, info = step("Right")  # box 2 onto its target: solved
  assert r == pytest.approx(-0.1 + 1.0 + 10.0) and term and info["success"]
  assert obs.splitlines()[1:3] == ["#___√#", "#__P√#"]


def test_push_off_target_costs_one():
  env = _env_with(["#######",
                   "#P√__O#",
                   "#######"])
  _, r, *_ = env.step("<answer>Right</answer>")
  assert r == pytest.approx(-0.1 - 1.0)
  assert env.render_text().splitlines()[1] == "#_SX_O#"


def test_same_seed_same_level_different_seed_varies():
  env = envs.make_env("Sokoban")
  first = [env.reset(seed=s)[0] for s in range(30)]
  assert [env.reset(seed=s)[0] for s in range(30)] == first
  assert len(set(first)) > 25


def test_grid_vocab_variant_and_gymnasium():
  env = gymnasium.make("rollx/SokobanDifferentGridVocab-v0", render_mode="rgb_array")
  obs, _ = env.reset(seed=4)
  assert set(obs) <= set("W.GCBA@\n") and "A" in obs
  assert env.render().shape == (144, 144, 3)
  assert "B is box" in env.unwrapped.instructions
  env = gymnasium.make("rollx/Sokoban-v0", dim_room=(7, 7))
  assert len(env.reset(seed=0)[0].splitlines()) == 7


def test_garbage_actions_never_raise():
  env = envs.make_env("Sokoban", dict(max_steps=100))
  env.reset(seed=1)
  for g in ["", "\u0000", "ü" * 3000, "<answer>" * 2000, "x" * 10_000, None, "<answer> </answer>"]:
    obs, r, *_ , info = env.step(g)
    assert r == pytest.approx(-0.15) and not info["action_is_valid"]


def test_bad_sokoban_config():
  with pytest.raises(ValueError, match="dim_room"):
    envs.make_env("Sokoban", dict(dim_room=(2, 9)))
  with pytest.raises(ValueError, match="grid_lookup"):
    envs.make_env("Sokoban", dict(grid_lookup={"wall": "#"}))
  with pytest.raises(ValueError, match="distinct"):
    envs.make_env("Sokoban", dict(grid_lookup=dict(sokoban.DEFAULT_GRID_LOOKUP, box="#")))
