"""The symmetries of a square board: rotations and mirrors, and how they relabel moves.

A grid game whose rules do not care about orientation (FrozenLake: the map
generator and the dynamics look the same rotated or mirrored) has, for every
decision (observation, move), equally valid copies seen through each symmetry: the
board transformed and the move relabelled ("Left" on a board turned half round is
"Right"). Training on such copies next to the played decision balances the moves a
batch reinforces (`train_env_manager.symmetric_views`, rollx.rollout.env_manager).

Each transform acts on the board (an array of tiles, row 0 at the top) and on a move
vector (d_row, d_col); the two agree: a player at (r, c) moving by v lands on the
transformed board at T(r, c) + T(v).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

Vector = Tuple[int, int]
# name -> (board transform, move-vector transform)
TRANSFORMS: Dict[str, Tuple[Callable[[np.ndarray], np.ndarray], Callable[[Vector], Vector]]] = {
    "rot90": (lambda b: np.rot90(b, 1), lambda v: (-v[1], v[0])),  # a quarter turn, anticlockwise
    "rot180": (lambda b: np.rot90(b, 2), lambda v: (-v[0], -v[1])),
    "rot270": (lambda b: np.rot90(b, 3), lambda v: (v[1], -v[0])),
    "flip_lr": (np.fliplr, lambda v: (v[0], -v[1])),  # mirror: left <-> right
    "flip_ud": (np.flipud, lambda v: (-v[0], v[1])),  # mirror: top <-> bottom
    "transpose": (lambda b: b.T, lambda v: (v[1], v[0])),  # mirror in the main diagonal
    "anti_transpose": (lambda b: np.rot90(b, 2).T, lambda v: (-v[1], -v[0])),
}
# The four grid moves every rollx grid env uses, as (d_row, d_col).
MOVES: Dict[str, Vector] = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def transform_board(rows: Sequence[Sequence[str]], name: str) -> list:
  """The board (rows of one-character tiles) seen through transform `name`."""
  board = np.array([list(row) for row in rows], dtype=object)
  return [list(row) for row in TRANSFORMS[name][0](board)]


def transform_move(move: str, name: str) -> str:
  """The move that does on the transformed board what `move` does on the original."""
  target = TRANSFORMS[name][1](MOVES[move])
  return next(m for m, v in MOVES.items() if v == target)


def transform_decision(observation: str, move: Optional[str], name: str,
                       footer_lines: int = 0) -> Tuple[list, Optional[str]]:
  """The board of a rendered `observation` (its last `footer_lines` lines, derived from
  the board, left for the env to redraw) seen through `name`, and the move taken on it
  relabelled (None, an invalid answer, stays None)."""
  lines = observation.split("\n")
  board = transform_board(lines[:len(lines) - footer_lines], name)
  return board, (transform_move(move, name) if move is not None else None)
