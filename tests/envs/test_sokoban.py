import gymnasium
import numpy as np
import pytest

import envs
from envs import sokoban
from envs import sokoban_solver


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


def _env_with(rows, **config):
  """A Sokoban env set to a hand-drawn level (# wall, _ floor, O target, X box, P player)."""
  env = envs.make_env("Sokoban", dict(max_steps=20, **config))
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


def test_show_neighbours_names_the_two_tiles_in_each_direction():
  """`show_neighbours`: the grid, then for Left, Down, Right, Up the tile next to the
  player and the one beyond it (a wall beyond the border); updated every step; off by
  default; in the variant's own symbols."""
  rows = ["######",
          "#P_X_#",
          "#_O__#",
          "######"]
  assert _env_with(rows).render_text() == "\n".join(rows)
  env = _env_with(rows, show_neighbours=True)
  assert env.render_text() == "\n".join(rows) + "\nLeft ## Down _# Right _X Up ##"
  assert env.observation_space.contains(env.render_text())
  env.step("<answer>Right</answer>")
  assert env.render_text().splitlines()[-1] == "Left _# Down O# Right X_ Up ##"
  obs, *_ = env.step("<answer>Right</answer>")  # push the box
  assert obs.splitlines()[1] == "#__PX#" and obs.splitlines()[-1] == "Left __ Down _# Right X# Up ##"
  env.step("<answer>Left</answer>")
  env.step("<answer>Down</answer>")  # onto the target: S, and the line reads from there
  assert env.render_text().splitlines()[2:] == ["#_S__#", "######",
                                               "Left _# Down ## Right __ Up _#"]
  edge = _env_with(["#P#", "###"], show_neighbours=True)  # beyond the border: a wall
  assert edge.neighbours() == "########"
  other = envs.make_env("Sokoban", dict(sokoban.VARIANTS["SokobanDifferentGridVocab"],
                                        show_neighbours=True))
  obs, _ = other.reset(seed=4)
  assert "#" not in obs and obs.splitlines()[-1].startswith("Left ")
  assert other.observation_space.contains(obs)


@pytest.mark.parametrize("show_neighbours", [False, True])
def test_symmetric_view_is_the_same_game_played_on_the_transformed_level(show_neighbours):
  """Playing a level, and playing its transformed copy with relabelled moves, give at
  every step the observations that `symmetric_view` derives from the first (pushes,
  targets, the neighbour line, a non-square room turned a quarter)."""
  from envs import symmetry
  assert set(sokoban.Sokoban.SYMMETRIES) == set(symmetry.TRANSFORMS)
  rng = np.random.default_rng(0)
  for name in symmetry.TRANSFORMS:
    for seed, dim_room in [(0, (6, 6)), (1, (6, 6)), (2, (6, 6)), (3, (5, 8))]:
      solution = None
      # random moves (walks, bumps, pushes) on one play, a solution on another
      for moves in ([str(m) for m in rng.choice(sokoban.Sokoban.ACTIONS, 8)], solution):
        a = envs.make_env("Sokoban", dict(dim_room=dim_room, max_steps=20,
                                          show_neighbours=show_neighbours))
        obs_a, _ = a.reset(seed=seed)
        moves = moves if moves is not None else sokoban_solver.solve(a.level)
        b = _env_with(["".join(r) for r in symmetry.transform_board(
            obs_a.splitlines()[:dim_room[0]], name)], show_neighbours=show_neighbours)
        obs_b = b.render_text()
        for move in moves:
          assert a.symmetric_view(obs_a, move, name) == (
              obs_b, symmetry.transform_move(move, name))
          assert a.symmetric_view(obs_a, None, name) == (obs_b, None)  # an invalid answer
          obs_a, r_a, done_a, _, _ = a.step(f"<answer>{move}</answer>")
          obs_b, r_b, done_b, _, _ = b.step(
              f"<answer>{symmetry.transform_move(move, name)}</answer>")
          assert (r_a, done_a) == pytest.approx((r_b, done_b))
          if done_a:
            break
        assert a.symmetric_view(obs_a, None, name)[0] == obs_b
      assert a.success and b.success  # the solution's play: pushes and the solved board


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
