"""An independent BFS Sokoban solver (forward play with pushes): a check of the
reverse-play generator (tests/envs/test_sokoban.py) and the rejection-sampling baseline of
bench/sokoban_gen.py."""

import collections

DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def solve(level, max_depth=200):
  """Shortest action list solving `level` (envs.sokoban.Level), or None."""
  w = level.width
  start = (level.player, level.boxes)
  parents = {start: None}
  queue = collections.deque([(start, 0)])
  while queue:
    (player, boxes), depth = queue.popleft()
    if boxes == level.targets:
      path, state = [], (player, boxes)
      while parents[state] is not None:
        state, action = parents[state]
        path.append(action)
      return path[::-1]
    if depth >= max_depth:
      continue
    for action, (dr, dc) in DELTAS.items():
      d = dr * w + dc
      q = player + d
      if q in level.walls:
        continue
      new_boxes = boxes
      if q in boxes:
        b = q + d
        if b in level.walls or b in boxes:
          continue
        new_boxes = (boxes - {q}) | {b}
      state = (q, new_boxes)
      if state not in parents:
        parents[state] = ((player, boxes), action)
        queue.append((state, depth + 1))
  return None
