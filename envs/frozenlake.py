"""FrozenLake as a text env; gymnasium's FrozenLake-v1 does the dynamics.

We generate the map (random start and goal, holes with probability 1 - p, always a
path from start to goal) and hand it to gymnasium's `FrozenLakeEnv` as `desc`, so
transitions, slipperiness and its RNG are gymnasium's own. Symbols follow ROLL:
P player, _ frozen, O hole, G goal, X player in a hole, √ player on the goal.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import List, Optional, Tuple

import numpy as np
from gymnasium.envs.toy_text import frozen_lake

from envs import base, symmetry
from envs.registry import register_env

# gymnasium's action ids.
ACTION_IDS = {"Left": 0, "Down": 1, "Right": 2, "Up": 3}
SYMBOLS = {"player": "P", "frozen": "_", "hole": "O", "goal": "G",
           "player_in_hole": "X", "player_on_goal": "√"}
_PALETTE = {
    "_": ((200, 230, 255), None),
    "O": ((20, 40, 90), None),
    "G": ((60, 180, 75), None),
    "P": ((200, 230, 255), (230, 60, 60)),
    "X": ((20, 40, 90), (230, 60, 60)),
    "√": ((60, 180, 75), (255, 215, 0)),
}


@dataclasses.dataclass
class FrozenLakeConfig(base.TextEnvConfig):
  size: int = 4  # the map is size x size
  p: float = 0.8  # probability that a tile is frozen (else a hole)
  is_slippery: bool = False  # gymnasium's slippery dynamics
  max_steps: int = 10  # actions per episode
  format_penalty: float = -0.01  # reward of an invalid action
  desc: Optional[Tuple[str, ...]] = None  # a fixed map (rows of S F H G); None = random
  # Below the grid, a line naming the tile next to P in each direction, e.g.
  # "Left _ Down O Right _ Up #" (# off the board): what an agent standing on the ice
  # sees around it, spelled out. Perception, not advice: which move is good it does not
  # say. Why: a small model reads 2-D neighbours out of a flattened grid slowly (offsets
  # +-1 and +-5 tokens; docs/frozenlake_recipe.md).
  show_neighbours: bool = False


def generate_map(size: int, p: float, rng: np.random.Generator) -> List[str]:
  """A random solvable map in gymnasium's alphabet (S start, F frozen, H hole, G goal)."""
  if size < 2:
    raise ValueError(f"FrozenLake size must be >= 2, got {size}")
  if not 0.0 < p <= 1.0:
    raise ValueError(f"FrozenLake p must be in (0, 1], got {p}")
  while True:
    grid = np.where(rng.random((size, size)) < p, "F", "H")
    start, goal = rng.choice(size * size, size=2, replace=False)
    grid.flat[start], grid.flat[goal] = "S", "G"
    if _has_path(grid, divmod(int(start), size), divmod(int(goal), size)):
      return ["".join(row) for row in grid]


def _has_path(grid: np.ndarray, start, goal) -> bool:
  size = grid.shape[0]
  seen, queue = {start}, collections.deque([start])
  while queue:
    r, c = queue.popleft()
    if (r, c) == goal:
      return True
    for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
      nr, nc = r + dr, c + dc
      if 0 <= nr < size and 0 <= nc < size and grid[nr, nc] != "H" and (nr, nc) not in seen:
        seen.add((nr, nc))
        queue.append((nr, nc))
  return False


_PLAYER_SYMBOLS = (SYMBOLS["player"], SYMBOLS["player_in_hole"], SYMBOLS["player_on_goal"])


def _neighbour_tiles(grid: List[List[str]], position: Tuple[int, int]) -> str:
  pr, pc = position
  out = []
  for dr, dc in (symmetry.MOVES[action] for action in ACTION_IDS):
    r, c = pr + dr, pc + dc
    inside = 0 <= r < len(grid) and 0 <= c < len(grid[0])
    out.append(grid[r][c] if inside else "#")
  return "".join(out)


def _board_text(grid: List[List[str]], position: Tuple[int, int], show_neighbours: bool) -> str:
  text = "\n".join("".join(row) for row in grid)
  if show_neighbours:
    text += "\n" + " ".join(f"{action} {tile}" for action, tile in
                            zip(ACTION_IDS, _neighbour_tiles(grid, position)))
  return text


@register_env("FrozenLake")
class FrozenLake(base.TextEnv):
  ACTIONS = tuple(ACTION_IDS)
  Config = FrozenLakeConfig
  # map generation and (slippery or not) dynamics look the same turned or mirrored
  SYMMETRIES = tuple(symmetry.TRANSFORMS)

  def __init__(self, config: Optional[FrozenLakeConfig] = None, render_mode=None):
    super().__init__(config, render_mode)
    self._lake: Optional[frozen_lake.FrozenLakeEnv] = None
    self.desc: List[str] = []

  def observation_charset(self) -> str:
    charset = "".join(SYMBOLS.values()) + "\n"
    if self.config.show_neighbours:
      charset += " #" + "".join(sorted(set("".join(ACTION_IDS))))
    return charset

  def check_config(self) -> None:
    cfg = self.config
    if cfg.desc is None:
      if cfg.size < 2:
        raise ValueError(f"FrozenLake size must be >= 2, got {cfg.size}")
      if not 0.0 < cfg.p <= 1.0:
        raise ValueError(f"FrozenLake p must be in (0, 1], got {cfg.p}")
    else:
      rows = list(cfg.desc)
      if (not rows or any(len(r) != len(rows[0]) for r in rows)
          or set("".join(rows)) - set("SFHG") or "".join(rows).count("S") != 1
          or "".join(rows).count("G") != 1):
        raise ValueError(f"FrozenLake desc must be equal-length rows of S F H G with one "
                         f"S and one G, got {rows}")

  def _new_episode(self, seed: int) -> None:
    cfg = self.config
    self.desc = list(cfg.desc) if cfg.desc else generate_map(
        cfg.size, cfg.p, np.random.default_rng(seed))
    self._lake = frozen_lake.FrozenLakeEnv(desc=self.desc, is_slippery=cfg.is_slippery)
    self._lake.reset(seed=seed)

  @property
  def position(self) -> Tuple[int, int]:
    return divmod(int(self._lake.s), len(self.desc[0]))

  def _apply(self, action: str):
    _, reward, terminated, _, _ = self._lake.step(ACTION_IDS[action])
    r, c = self.position
    return float(reward), bool(terminated), self.desc[r][c] == "G"

  def render_grid(self) -> List[List[str]]:
    pr, pc = self.position
    grid = []
    for r, row in enumerate(self.desc):
      out = []
      for c, tile in enumerate(row):
        here = (r, c) == (pr, pc)
        if tile == "H":
          out.append(SYMBOLS["player_in_hole"] if here else SYMBOLS["hole"])
        elif tile == "G":
          out.append(SYMBOLS["player_on_goal"] if here else SYMBOLS["goal"])
        else:
          out.append(SYMBOLS["player"] if here else SYMBOLS["frozen"])
      grid.append(out)
    return grid

  def neighbours(self) -> str:
    """The tiles next to P in action order (Left, Down, Right, Up), '#' off the board.

    Perception, not advice: a warm start that writes it before a random answer
    (rollx.recipes.warm_start `think_tags`) teaches a model to read P's surroundings,
    as an instruct model asked to "look around first" would; which move is good it
    does not say.
    """
    return _neighbour_tiles(self.render_grid(), self.position)

  def render_text(self) -> str:
    return _board_text(self.render_grid(), self.position, self.config.show_neighbours)

  def symmetric_view(self, observation: str, action: Optional[str],
                     transform: str) -> Tuple[str, Optional[str]]:
    grid, moved = symmetry.transform_decision(observation, action, transform,
                                              footer_lines=int(self.config.show_neighbours))
    player = next((r, c) for r, row in enumerate(grid) for c, tile in enumerate(row)
                  if tile in _PLAYER_SYMBOLS)
    return _board_text(grid, player, self.config.show_neighbours), moved

  def render_rgb(self) -> np.ndarray:
    return base.grid_to_rgb(self.render_grid(), _PALETTE)

  @property
  def instructions(self) -> str:
    slip = " The ice is slippery: you may move sideways." if self.config.is_slippery else ""
    return ("You are solving the FrozenLake puzzle. Walk from your position to the goal "
            "without falling into a hole." + slip + "\nSymbols: P is you, _ is frozen "
            "ice, O is a hole, G is the goal, X means you fell into a hole, √ means you "
            "reached the goal.\nValid actions: Left, Down, Right, Up. Answer like "
            "<answer>Right</answer>.")
