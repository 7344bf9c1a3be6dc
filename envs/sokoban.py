"""Sokoban as a text env, with our own level generator.

Levels are made backwards: carve a room by random walk, put every box on its
target, then search *reverse* play (the player walks, and may pull a box it
steps away from) up to `search_depth` moves, and start the level from the
reachable state whose boxes sit furthest from the targets. Every reverse move is
the inverse of a legal forward move (walk or push), so the reversed path solves
the level: every generated level is solvable in at most `search_depth` moves.
Rooms where no box could be moved off its target are rejected and re-carved.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, List, Optional, Tuple

import gymnasium
import numpy as np

from envs import base, symmetry
from envs.registry import register_env

ACTION_DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
NEIGHBOUR_ORDER = tuple(symmetry.MOVES)  # Left, Down, Right, Up: FrozenLake's line order
CELL_NAMES = ("wall", "empty", "target", "box_on_target", "box", "player",
              "player_on_target")
DEFAULT_GRID_LOOKUP = {"wall": "#", "empty": "_", "target": "O", "box_on_target": "√",
                       "box": "X", "player": "P", "player_on_target": "S"}
_PALETTE = {  # by cell name
    "wall": ((90, 60, 40), None),
    "empty": ((230, 225, 210), None),
    "target": ((230, 225, 210), (240, 170, 170)),
    "box_on_target": ((230, 225, 210), (60, 180, 75)),
    "box": ((230, 225, 210), (200, 140, 50)),
    "player": ((230, 225, 210), (50, 90, 220)),
    "player_on_target": ((240, 170, 170), (50, 90, 220)),
}

REWARD_STEP = -0.1
REWARD_BOX_ON_TARGET = 1.0
REWARD_BOX_OFF_TARGET = -1.0
REWARD_SOLVED = 10.0


@dataclasses.dataclass
class SokobanConfig(base.TextEnvConfig):
  dim_room: Tuple[int, int] = (6, 6)  # rows, cols, outer walls included
  num_boxes: int = 1
  search_depth: int = 30  # reverse-play moves; bounds the optimal solution length
  max_steps: int = 10  # actions per episode
  format_penalty: float = -0.15  # reward of an invalid action
  grid_lookup: Optional[Dict[str, str]] = None  # cell name -> symbol; None = ROLL's
  grid_vocab: Optional[Dict[str, str]] = None  # symbol -> meaning for the prompt
  # Below the grid, a line naming, for each move, the tile next to the player and the one
  # beyond it, e.g. "Left #_ Down __ Right X_ Up _O": what a push would move and into
  # what (a wall beyond the border). Perception, not advice (which move is good it does not
  # say), in FrozenLake's format (`FrozenLakeConfig.show_neighbours`), for the same
  # reason: a small model reads 2-D neighbours out of a flattened grid slowly. The default
  # model was warm started with it on SimpleSokoban; a model that was not answers such
  # prompts with more board text ~40-50% of the time.
  show_neighbours: bool = False


# Named variants (ROLL's): use as `env_config` of a custom_envs entry.
VARIANTS = {
    "SimpleSokoban": dict(dim_room=(6, 6), num_boxes=1, search_depth=30, max_steps=10),
    "LargerSokoban": dict(dim_room=(10, 10), num_boxes=2, search_depth=10, max_steps=20),
    "SokobanDifferentGridVocab": dict(
        dim_room=(6, 6), num_boxes=1, search_depth=30, max_steps=10,
        grid_lookup={"wall": "W", "empty": ".", "target": "G", "box_on_target": "C",
                     "box": "B", "player": "A", "player_on_target": "@"}),
}


@dataclasses.dataclass(frozen=True)
class Level:
  """A Sokoban position: static walls/targets plus the player and boxes (flat ids)."""
  height: int
  width: int
  walls: FrozenSet[int]
  targets: FrozenSet[int]
  player: int
  boxes: FrozenSet[int]


# Shapes carved around each random-walk position (offsets); mixing single cells
# with blocks and crosses gives rooms rather than one-cell corridors.
_CARVE_MASKS = (
    ((0, 0),),
    ((0, 0), (0, 1)),
    ((0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
    ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)),
)


def _carve_room(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
  """Random-walk floor inside a wall border; True = floor."""
  floor = np.zeros((h, w), bool)
  r, c = int(rng.integers(1, h - 1)), int(rng.integers(1, w - 1))
  directions = list(ACTION_DELTAS.values())
  direction = directions[int(rng.integers(4))]
  for _ in range(int(1.7 * (h + w))):
    for dr, dc in _CARVE_MASKS[int(rng.integers(len(_CARVE_MASKS)))]:
      if 1 <= r + dr < h - 1 and 1 <= c + dc < w - 1:
        floor[r + dr, c + dc] = True
    if rng.random() < 0.35:
      direction = directions[int(rng.integers(4))]
    nr, nc = r + direction[0], c + direction[1]
    if 1 <= nr < h - 1 and 1 <= nc < w - 1:
      r, c = nr, nc
  return floor


def _reverse_search(floor: np.ndarray, targets: Tuple[int, ...], player: int,
                    search_depth: int, rng: np.random.Generator):
  """BFS over reverse play from the solved state; returns the hardest start found."""
  h, w = floor.shape
  is_floor = floor.ravel()
  deltas = [dr * w + dc for dr, dc in ACTION_DELTAS.values()]
  target_rc = [divmod(t, w) for t in targets]

  def score(boxes):
    off = [b for b in boxes if b not in targets]
    dist = sum(min(abs(br - tr) + abs(bc - tc) for tr, tc in target_rc)
               for br, bc in (divmod(b, w) for b in boxes))
    return (len(off), dist)

  start = (player, frozenset(targets))
  seen = {start}
  frontier = [start]
  best, best_states = (0, 0), []
  for _ in range(search_depth):
    next_frontier = []
    for p, boxes in frontier:
      for d in deltas:
        q = p + d  # player steps to q
        if not is_floor[q] or q in boxes:
          continue
        options = [(q, boxes)]
        if p - d in boxes:  # or pulls the box behind it into p
          options.append((q, (boxes - {p - d}) | {p}))
        for state in options:
          if state not in seen:
            seen.add(state)
            next_frontier.append(state)
            s = score(state[1])
            if s > best:
              best, best_states = s, [state]
            elif s == best and s[0] > 0:
              best_states.append(state)
    frontier = next_frontier
    if not frontier:
      break
  if best[0] == 0:
    return None
  return best_states[int(rng.integers(len(best_states)))]


def check_level_args(dim_room, num_boxes: int, search_depth: int) -> None:
  if len(dim_room) != 2 or min(dim_room) < 4:
    raise ValueError(f"Sokoban dim_room must be (rows, cols), each >= 4, got {dim_room}")
  if num_boxes < 1 or num_boxes > (dim_room[0] - 2) * (dim_room[1] - 2) // 3:
    raise ValueError(f"Sokoban num_boxes={num_boxes} does not fit dim_room={dim_room}")
  if search_depth < 1:
    raise ValueError(f"Sokoban search_depth must be >= 1, got {search_depth}")


def generate_level(dim_room: Tuple[int, int], num_boxes: int, search_depth: int,
                   rng: np.random.Generator, max_tries: int = 1000) -> Level:
  check_level_args(dim_room, num_boxes, search_depth)
  h, w = int(dim_room[0]), int(dim_room[1])
  for _ in range(max_tries):
    floor = _carve_room(h, w, rng)
    cells = np.flatnonzero(floor.ravel())
    if len(cells) < num_boxes + 2:
      continue
    picks = rng.choice(cells, size=num_boxes + 1, replace=False)
    targets = tuple(int(t) for t in picks[:num_boxes])
    found = _reverse_search(floor, targets, int(picks[-1]), search_depth, rng)
    if found is None:
      continue
    player, boxes = found
    walls = frozenset(int(i) for i in np.flatnonzero(~floor.ravel()))
    return Level(h, w, walls, frozenset(targets), int(player), frozenset(boxes))
  raise RuntimeError(f"no Sokoban level with dim_room={dim_room}, num_boxes={num_boxes} "
                     f"in {max_tries} rooms")


def move(level: Level, player: int, boxes: FrozenSet[int],
         action: str) -> Tuple[int, FrozenSet[int], float]:
  """One forward move from (player, boxes) on `level`: the player and boxes after it and
  its reward, the solve bonus left out. Into a wall, or pushing a box into a wall or
  another box, nothing moves (and the move still costs REWARD_STEP)."""
  dr, dc = ACTION_DELTAS[action]
  d = dr * level.width + dc
  reward = REWARD_STEP
  q = player + d
  if q in level.walls:
    return player, boxes, reward
  if q in boxes:
    b = q + d
    if b in level.walls or b in boxes:
      return player, boxes, reward
    boxes = (boxes - {q}) | {b}
    reward += (b in level.targets) * REWARD_BOX_ON_TARGET
    reward += (q in level.targets) * REWARD_BOX_OFF_TARGET
  return q, boxes, reward


def _neighbour_tiles(grid: List[List[str]], position: Tuple[int, int], wall: str) -> str:
  pr, pc = position
  out = []
  for action in NEIGHBOUR_ORDER:
    dr, dc = ACTION_DELTAS[action]
    for k in (1, 2):
      r, c = pr + k * dr, pc + k * dc
      inside = 0 <= r < len(grid) and 0 <= c < len(grid[0])
      out.append(grid[r][c] if inside else wall)
  return "".join(out)


def _board_text(grid: List[List[str]], lookup: Dict[str, str], show_neighbours: bool) -> str:
  text = "\n".join("".join(row) for row in grid)
  if show_neighbours:
    player = next((r, c) for r, row in enumerate(grid) for c, tile in enumerate(row)
                  if tile in (lookup["player"], lookup["player_on_target"]))
    tiles = _neighbour_tiles(grid, player, lookup["wall"])
    text += "\n" + " ".join(f"{action} {tiles[2 * i:2 * i + 2]}"
                             for i, action in enumerate(NEIGHBOUR_ORDER))
  return text


@register_env("Sokoban")
class Sokoban(base.TextEnv):
  ACTIONS = ("Up", "Down", "Left", "Right")
  Config = SokobanConfig
  # The rules (walls, pushes, targets) are the same turned or mirrored, so a view is a
  # legal position whose relabelled move does what the played one did; a view of a
  # non-square room is a room of the other shape
  SYMMETRIES = tuple(symmetry.TRANSFORMS)

  def __init__(self, config: Optional[SokobanConfig] = None, render_mode=None):
    config = config if config is not None else SokobanConfig()
    # The symbols must be known before the base class builds the observation space.
    self.lookup = dict(config.grid_lookup or DEFAULT_GRID_LOOKUP)
    missing = [n for n in CELL_NAMES if n not in self.lookup]
    extra = sorted(set(self.lookup) - set(CELL_NAMES))
    if missing or extra:
      raise ValueError(f"Sokoban grid_lookup must name exactly {CELL_NAMES}; "
                       f"missing {missing}, unknown {extra}")
    symbols = list(self.lookup.values())
    if any(len(s) != 1 for s in symbols) or len(set(symbols)) != len(symbols):
      raise ValueError(f"Sokoban grid_lookup symbols must be distinct single characters, "
                       f"got {self.lookup}")
    default_vocab = {self.lookup[n]: n.replace("_", " ") for n in CELL_NAMES}
    self.vocab = dict(config.grid_vocab or default_vocab)
    unknown = sorted(set(self.vocab) - set(symbols))
    if unknown:
      raise ValueError(f"Sokoban grid_vocab has symbols {unknown} not in grid_lookup")
    super().__init__(config, render_mode)
    self.level: Optional[Level] = None
    self.player = 0
    self.boxes: FrozenSet[int] = frozenset()

  def observation_charset(self) -> str:
    charset = "".join(self.lookup.values()) + "\n"
    if self.config.show_neighbours:
      charset += " " + "".join(sorted(set("".join(NEIGHBOUR_ORDER))))
    return charset

  def check_config(self) -> None:
    check_level_args(self.config.dim_room, self.config.num_boxes, self.config.search_depth)

  def _new_episode(self, seed: int) -> None:
    cfg = self.config
    self.level = generate_level(cfg.dim_room, cfg.num_boxes, cfg.search_depth,
                                np.random.default_rng(seed))
    self.player, self.boxes = self.level.player, self.level.boxes

  def _apply(self, action: str):
    self.player, self.boxes, reward = move(self.level, self.player, self.boxes, action)
    solved = self.boxes == self.level.targets
    if solved:
      reward += REWARD_SOLVED
    return reward, solved, solved

  def cell_names(self) -> List[List[str]]:
    lv = self.level
    grid = []
    for r in range(lv.height):
      row = []
      for c in range(lv.width):
        i = r * lv.width + c
        on_target = i in lv.targets
        if i in lv.walls:
          row.append("wall")
        elif i == self.player:
          row.append("player_on_target" if on_target else "player")
        elif i in self.boxes:
          row.append("box_on_target" if on_target else "box")
        else:
          row.append("target" if on_target else "empty")
      grid.append(row)
    return grid

  def neighbours(self) -> str:
    """For each move in NEIGHBOUR_ORDER, the tile next to the player and the one beyond
    it (a wall beyond the border), e.g. `#___X_#_`."""
    return _neighbour_tiles(self._grid(), divmod(self.player, self.level.width),
                            self.lookup["wall"])

  def _grid(self) -> List[List[str]]:
    return [[self.lookup[n] for n in row] for row in self.cell_names()]

  def render_text(self) -> str:
    return _board_text(self._grid(), self.lookup, self.config.show_neighbours)

  def symmetric_view(self, observation: str, action: Optional[str],
                     transform: str) -> Tuple[str, Optional[str]]:
    grid, moved = symmetry.transform_decision(observation, action, transform,
                                              footer_lines=int(self.config.show_neighbours))
    return _board_text(grid, self.lookup, self.config.show_neighbours), moved

  def render_rgb(self) -> np.ndarray:
    return base.grid_to_rgb(self.cell_names(), _PALETTE)

  @property
  def instructions(self) -> str:
    legend = ", ".join(f"{s} is {m}" for s, m in self.vocab.items())
    return ("You are solving the Sokoban puzzle. Push every box onto a target. You can "
            "push a box but not pull it, and you cannot push it into a wall or another "
            f"box.\nSymbols: {legend}.\nValid actions: Up, Down, Left, Right. Answer "
            "like <answer>Up</answer>.")


def _variant_entry_point(variant: str):

  def make(render_mode=None, **overrides):
    from envs.registry import make_env
    return make_env("Sokoban", {**VARIANTS[variant], **overrides}, render_mode=render_mode)

  return make


for _name in VARIANTS:
  if f"rollx/{_name}-v0" not in gymnasium.registry:
    gymnasium.register(id=f"rollx/{_name}-v0", entry_point=_variant_entry_point(_name))
