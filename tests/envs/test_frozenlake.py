import gymnasium
import numpy as np
import pytest

import envs
from envs import frozenlake

GYM_ACTIONS = {"Left": 0, "Down": 1, "Right": 2, "Up": 3}


@pytest.mark.parametrize("is_slippery", [False, True])
def test_transitions_match_gymnasium(is_slippery):
  for seed in range(20):
    env = envs.make_env("FrozenLake", dict(is_slippery=is_slippery, max_steps=30))
    env.reset(seed=seed)
    ref = gymnasium.make("FrozenLake-v1", desc=env.desc, is_slippery=is_slippery)
    ref_state, _ = ref.reset(seed=seed)
    assert env._lake.s == ref_state
    rng = np.random.default_rng(seed)
    for _ in range(30):
      action = frozenlake.FrozenLake.ACTIONS[rng.integers(4)]
      _, reward, terminated, _, info = env.step(f"<answer>{action}</answer>")
      ref_state, ref_reward, ref_terminated, _, _ = ref.step(GYM_ACTIONS[action])
      assert env._lake.s == ref_state
      assert reward == ref_reward and terminated == ref_terminated
      assert info["action_is_valid"]
      if terminated:
        assert info["success"] == (env.desc[ref_state // 4][ref_state % 4] == "G")
        break


def test_invalid_action_is_penalised_counted_and_does_not_move():
  env = envs.make_env("FrozenLake")
  obs, _ = env.reset(seed=3)
  for i, garbage in enumerate(["", "Right", "<answer>Jump</answer>", "💥" * 100, "x" * 10_000]):
    new_obs, reward, terminated, truncated, info = env.step(garbage)
    assert new_obs == obs
    assert reward == pytest.approx(-0.01)
    assert not terminated and not info["action_is_valid"]
    assert info["num_invalid_actions"] == i + 1
    assert not info["action_is_effective"] and info["num_ineffective_actions"] == 0


def test_a_move_into_the_edge_is_valid_but_not_effective():
  """A move off the board leaves P where it was: valid (gymnasium's semantics, no
  penalty), counted as ineffective; a move, and the move onto the terminal tile, are
  effective."""
  env = frozenlake.FrozenLake(frozenlake.FrozenLakeConfig(desc=("SF", "HG")))
  obs, _ = env.reset(seed=0)
  for i, action in enumerate(["Up", "Left", "Up"]):
    new_obs, reward, terminated, truncated, info = env.step(f"<answer>{action}</answer>")
    assert new_obs == obs and reward == 0.0 and not terminated
    assert info["action_is_valid"] and not info["action_is_effective"]
    assert info["num_ineffective_actions"] == i + 1 and info["num_invalid_actions"] == 0
  _, _, _, _, info = env.step("<answer>Right</answer>")
  assert info["action_is_effective"] and info["num_ineffective_actions"] == 3
  _, reward, terminated, _, info = env.step("<answer>Down</answer>")
  assert terminated and reward == 1.0 and info["action_is_effective"]
  assert env.reset(seed=0)[0] == obs and env.num_ineffective_actions == 0


def test_ineffective_action_ends_episode_only_when_configured():
  """With `ineffective_action_ends_episode` a move off the board is a failure that ends
  the episode (as a fall into a hole does); an invalid answer still does not end it, and
  effective moves play on."""
  env = frozenlake.FrozenLake(frozenlake.FrozenLakeConfig(
      desc=("SF", "HG"), ineffective_action_ends_episode=True))
  obs, _ = env.reset(seed=0)
  new_obs, reward, terminated, truncated, info = env.step("<answer>nope</answer>")
  assert not terminated and not info["action_is_valid"]
  new_obs, reward, terminated, truncated, info = env.step("<answer>Right</answer>")
  assert not terminated and info["action_is_effective"]
  new_obs, reward, terminated, truncated, info = env.step("<answer>Up</answer>")
  assert terminated and not truncated and reward == 0.0 and not info["success"]
  assert not info["action_is_effective"] and info["num_ineffective_actions"] == 1
  assert env.done
  with pytest.raises(RuntimeError, match="reset"):
    env.step("<answer>Down</answer>")
  env.reset(seed=0)
  env.step("<answer>Right</answer>")
  _, reward, terminated, _, info = env.step("<answer>Down</answer>")
  assert terminated and reward == 1.0 and info["success"] and info["action_is_effective"]
  # the default: the same move leaves the episode running (see the test above)
  default = frozenlake.FrozenLake(frozenlake.FrozenLakeConfig(desc=("SF", "HG")))
  default.reset(seed=0)
  assert not default.step("<answer>Up</answer>")[2]


def test_max_steps_truncates_and_finished_episode_refuses_steps():
  env = envs.make_env("FrozenLake", dict(max_steps=3))
  env.reset(seed=0)
  outs = [env.step("nope") for _ in range(3)]
  assert [o[3] for o in outs] == [False, False, True]
  assert outs[-1][4]["actions_left"] == 0
  with pytest.raises(RuntimeError, match="reset"):
    env.step("<answer>Up</answer>")


def test_same_seed_same_map_and_maps_are_solvable():
  env = envs.make_env("FrozenLake")
  maps = {}
  for seed in range(200):
    obs, _ = env.reset(seed=seed)
    assert env.reset(seed=seed)[0] == obs
    flat = "".join(env.desc)
    assert flat.count("S") == 1 and flat.count("G") == 1
    assert frozenlake._has_path(np.array([list(r) for r in env.desc]),
                                divmod(flat.index("S"), 4), divmod(flat.index("G"), 4))
    maps[seed] = tuple(env.desc)
  assert len(set(maps.values())) > 150  # random maps, random start and goal


def test_symbols_and_render():
  env = envs.make_env("FrozenLake", dict(desc=("SFF", "FHF", "FFG")))
  obs, _ = env.reset(seed=0)
  assert obs == "P__\n_O_\n__G"
  env.step("<answer>Down</answer>")
  obs, *_ = env.step("<answer>Right</answer>")
  assert obs == "___\n_X_\n__G"
  env.reset(seed=0)
  for a in ["Right", "Right", "Down", "Down"]:
    obs, reward, terminated, _, info = env.step(f"<answer>{a}</answer>")
  assert obs == "___\n_O_\n__√" and reward == 1.0 and terminated and info["success"]
  frame = env.render("rgb_array")
  assert frame.dtype == np.uint8 and frame.shape == (72, 72, 3)
  assert env.render() == obs
  with pytest.raises(ValueError, match="render mode"):
    env.render("human")


def test_gymnasium_registration():
  env = gymnasium.make("rollx/FrozenLake-v0", is_slippery=True, render_mode="rgb_array")
  obs, _ = env.reset(seed=1)
  assert isinstance(obs, str) and env.render().ndim == 3
  env.step("<answer>Up</answer>")


def test_bad_env_config_names_field():
  with pytest.raises(ValueError, match="size"):
    envs.make_env("FrozenLake", dict(size=1))
  with pytest.raises(ValueError, match="'sz'"):
    envs.make_env("FrozenLake", dict(sz=4))
  with pytest.raises(KeyError, match="Frozen"):
    envs.make_env("Frozen")


def test_neighbours_in_action_order_with_walls():
  env = frozenlake.FrozenLake(frozenlake.FrozenLakeConfig(desc=("SFH", "HFF", "FFG")))
  env.reset(seed=0)
  assert env.neighbours() == "#O_#"  # Left wall, Down hole, Right frozen, Up wall
  env.step("<answer>Right</answer>")
  assert env.neighbours() == "__O#"  # the start tile reads as frozen ice
  env.step("<answer>Down</answer>")
  assert env.neighbours() == "O___"  # at (1, 1): a hole on the left, ice elsewhere


def test_show_neighbours_spells_out_the_tiles_next_to_the_player():
  """`show_neighbours`: the grid, then one line naming each move's tile ('#' off the
  board), updated after every step and on the terminal board; off by default."""
  desc = ("SFH", "HFF", "FFG")
  plain = frozenlake.FrozenLake(frozenlake.FrozenLakeConfig(desc=desc))
  assert plain.reset(seed=0)[0] == "P_O\nO__\n__G"
  env = frozenlake.FrozenLake(frozenlake.FrozenLakeConfig(desc=desc, show_neighbours=True))
  obs, _ = env.reset(seed=0)
  assert obs == "P_O\nO__\n__G\nLeft # Down O Right _ Up #"
  assert env.observation_space.contains(obs)
  obs, *_ = env.step("<answer>Right</answer>")
  assert obs.splitlines()[-1] == "Left _ Down _ Right O Up #"
  obs, reward, terminated, _, _ = env.step("<answer>Right</answer>")  # into the hole
  assert terminated and reward == 0.0
  assert obs == "__X\nO__\n__G\nLeft _ Down _ Right # Up #"
  assert env.observation_space.contains(obs)


def test_board_symmetries_relabel_moves_by_hand():
  from envs import symmetry
  assert {m: symmetry.transform_move(m, "rot180") for m in symmetry.MOVES} == {
      "Left": "Right", "Down": "Up", "Right": "Left", "Up": "Down"}
  # a quarter turn anticlockwise: what was to the right is now above
  assert {m: symmetry.transform_move(m, "rot90") for m in symmetry.MOVES} == {
      "Left": "Down", "Down": "Right", "Right": "Up", "Up": "Left"}
  assert symmetry.transform_board(["ab", "cd"], "rot90") == [["b", "d"], ["a", "c"]]
  assert symmetry.transform_board(["ab", "cd"], "anti_transpose") == [["d", "b"], ["c", "a"]]
  for name in symmetry.TRANSFORMS:  # each is a bijection of the four moves
    assert sorted(symmetry.transform_move(m, name) for m in symmetry.MOVES) == sorted(
        symmetry.MOVES)


@pytest.mark.parametrize("show_neighbours", [False, True])
def test_symmetric_view_is_the_same_game_played_on_the_transformed_map(show_neighbours):
  """Playing a map, and playing its transformed copy with relabelled moves, give at
  every step the observations that `symmetric_view` derives from the first."""
  from envs import symmetry
  rng = np.random.default_rng(0)
  for name in symmetry.TRANSFORMS:
    for seed in range(5):
      desc = frozenlake.generate_map(4, 0.8, np.random.default_rng(seed))
      turned = ["".join(r) for r in symmetry.transform_board(desc, name)]
      a = envs.make_env("FrozenLake", dict(desc=tuple(desc), show_neighbours=show_neighbours))
      b = envs.make_env("FrozenLake", dict(desc=tuple(turned), show_neighbours=show_neighbours))
      obs_a, _ = a.reset(seed=seed)
      obs_b, _ = b.reset(seed=seed)
      for _ in range(10):
        move = str(rng.choice(frozenlake.FrozenLake.ACTIONS))
        assert a.symmetric_view(obs_a, move, name) == (obs_b, symmetry.transform_move(move, name))
        assert a.symmetric_view(obs_a, None, name) == (obs_b, None)  # an invalid answer
        obs_a, r_a, done_a, trunc_a, _ = a.step(f"<answer>{move}</answer>")
        obs_b, r_b, done_b, trunc_b, _ = b.step(
            f"<answer>{symmetry.transform_move(move, name)}</answer>")
        assert (r_a, done_a, trunc_a) == (r_b, done_b, trunc_b)
        if done_a or trunc_a:
          break


def test_replace_action_keeps_the_rest_of_the_response():
  from envs.parsing import replace_action
  assert replace_action("<answer> Left </answer>", "Right") == "<answer> Right </answer>"
  assert replace_action("so <answer>up</answer> <answer>Down</answer>", "Left") == (
      "so <answer>Left</answer> <answer>Down</answer>")
  assert replace_action("no answer", "Up") == "no answer"
