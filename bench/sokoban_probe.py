"""SimpleSokoban capacity probe: can the model learn the task when told the answer?

    python bench/sokoban_probe.py --config=configs/simple_sokoban.py [--model_dir=DIR]

RL on configs/simple_sokoban.py stays flat for 60 minutes with the policy near its warm
start (README, SimpleSokoban section). Is that the reward signal or the model? This
probe removes RL, as bench/frozenlake_probe.py does for FrozenLake: it trains the model
(by default the shipped `rollx/models/default`) by supervised next-token loss on states
of random training levels, each answered with one of its shortest-solution moves (the
history-free step prompt the rollouts build, then `<answer>Move</answer>`; labels from
an exact search over every state reachable from the level's start), and every
`--eval_every` labels reports
- accuracy: on held-out states, the share where the model's top move starts a shortest
  solution (a uniform policy: ~0.27, the share of such moves among the four);
- greedy success on the validation levels, played through the rollouts' EnvManager, and
  its ratio to random moves on the same levels; the optimal policy's success within the
  episode's move limit closes the report (the ceiling: some levels need more moves).
A model that cannot get far above the random level here cannot be expected to by RL.
"""

from __future__ import annotations

import collections
import os
import random
import sys
import tempfile
from typing import Dict, FrozenSet, List, Tuple

from absl import app, flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollx import cli  # noqa: E402  (defines --config)

FLAGS = flags.FLAGS
TAG = "SimpleSokoban"
State = Tuple[int, FrozenSet[int]]  # (player, boxes)


def goal_distances(level) -> Dict[State, int]:
  """Moves to the solution from every state reachable from the level's start, by the env's
  own rules (`envs.sokoban.move`); states from which no solution exists are absent."""
  from envs import sokoban
  start = (level.player, level.boxes)
  preds, seen, queue = collections.defaultdict(set), {start}, collections.deque([start])
  solved = []
  while queue:
    state = queue.popleft()
    if state[1] == level.targets:  # the episode ends here
      solved.append(state)
      continue
    for action in sokoban.ACTION_DELTAS:
      player, boxes, _ = sokoban.move(level, *state, action)
      nxt = (player, boxes)
      preds[nxt].add(state)
      if nxt not in seen:
        seen.add(nxt)
        queue.append(nxt)
  dist = {s: 0 for s in solved}
  queue = collections.deque(solved)
  while queue:
    state = queue.popleft()
    for prev in preds[state]:
      if prev not in dist:
        dist[prev] = dist[state] + 1
        queue.append(prev)
  return dist


def shortest_moves(level, state: State, dist: Dict[State, int]) -> List[str]:
  """The moves from `state` that start a shortest solution ([] if there is none)."""
  from envs import sokoban
  if state not in dist or dist[state] == 0:
    return []
  return [a for a in sokoban.ACTION_DELTAS
          if dist.get(sokoban.move(level, *state, a)[:2]) == dist[state] - 1]


def labelled_states(config, tokenizer, num: int, seed: int):
  """`num` states visited by a half-optimal, half-random walker on random training levels:
  (ids, segment ids, [(answer position, shortest-solution moves)], moves to the solution),
  labelled with one shortest-solution move drawn at random. The walk leaves a level when
  the box is stuck (no solution left)."""
  import envs
  from bench.frozenlake_probe import answer_row, pad_rows
  from rollx.rollout import prompts
  entry = config.custom_envs[TAG]
  env = envs.make_env(entry.env_type, entry.env_config.to_dict())
  builder = prompts.builder_for(entry, env, tokenizer)
  rng = random.Random(seed)
  rows, moves, depth = [], [], []
  while len(rows) < num:
    env.reset(seed=rng.randrange(2**31))
    dist = goal_distances(env.level)
    turn = 0
    while len(rows) < num:
      state = (env.player, env.boxes)
      best = shortest_moves(env.level, state, dist)
      if not best:
        break
      turn += 1
      prompt = builder.step_prompt(env.render_text(), turn, env.actions_left, (), 0)
      rows.append(answer_row(tokenizer, prompt, rng.choice(best)))
      moves.append((len(prompt) + 1, best))
      depth.append(dist[state])
      act = rng.choice(best) if rng.random() < 0.5 else rng.choice(list(env.ACTIONS))
      _, _, terminated, truncated, _ = env.step(f"<answer>{act}</answer>")
      if terminated or truncated:
        break
  return (*pad_rows(rows), moves, np.asarray(depth))


def play_reference(config, optimal: bool, seeds: List[int]) -> float:
  """Success within the move limit of random moves, or of a shortest solution."""
  from bench.frozenlake_policies import play_levels
  dist_of = {}  # level -> goal distances, searched once per level

  def choose(env, rng):
    best = []
    if optimal:
      if env.level not in dist_of:
        dist_of[env.level] = goal_distances(env.level)
      best = shortest_moves(env.level, (env.player, env.boxes), dist_of[env.level])
    return rng.choice(best or list(env.ACTIONS))

  return play_levels(config, TAG, choose, seeds)


def play_model(config, model_dir: str, seeds: List[int]) -> float:
  """Greedy (val sampling) success of an exported policy on the levels."""
  from bench.frozenlake_policies import model_episodes
  wins = sum(traj.success for _, traj in model_episodes(config, model_dir, seeds, TAG))
  return wins / len(seeds)


def run(config, model_dir: str, labels: int, eval_every: int, batch_size: int,
        learning_rate: float, seed: int, val_generations: int) -> List[dict]:
  from bench.frozenlake_policies import validation_seeds
  from bench.frozenlake_probe import SupervisedProbe
  from envs import sokoban
  names = list(sokoban.ACTION_DELTAS)
  probe = SupervisedProbe(model_dir, names, labels // batch_size, batch_size, learning_rate)
  ids, seg, moves, _ = labelled_states(config, probe.tokenizer, max(labels, 1), seed)
  test_ids, test_seg, test_moves, _ = labelled_states(config, probe.tokenizer, 2048, seed + 1)
  uniform = float(np.mean([len(best) / len(names) for _, best in test_moves]))
  val_seeds = validation_seeds(config, val_generations, TAG)
  random_success = play_reference(config, False, val_seeds)

  def evaluate(params, seen):
    p_move = probe.move_probs(params, test_ids, test_seg, [at for at, _ in test_moves])
    pick = [names[int(k)] for k in np.argmax(p_move, axis=1)]
    acc = float(np.mean([pick[i] in best for i, (_, best) in enumerate(test_moves)]))
    with tempfile.TemporaryDirectory() as out:
      probe.export(params, out)
      success = play_model(config.copy_and_resolve_references(), out, val_seeds)
    row = dict(labels=seen, acc=acc, uniform=uniform, val_success=success,
               ratio=success / max(random_success, 1e-9))
    print(f"labels {seen:6d}  acc {acc:.3f} (uniform {uniform:.3f}, {len(test_moves)} states)  "
          f"val success {success:.3f} ({row['ratio']:.1f}x random moves)", flush=True)
    return row

  results = probe.fit(ids[:labels], seg[:labels], [at for at, _ in moves[:labels]], seed,
                      eval_every, evaluate)
  print(f"references on the same {len(val_seeds)} levels: random moves {random_success:.3f}, "
        f"shortest solution {play_reference(config, True, val_seeds):.3f}", flush=True)
  return results


def main(argv):
  del argv
  from rollx.models import make_default
  config = cli.load_config()
  if TAG not in config.custom_envs:
    cli.fail(f"--config: no custom_envs.{TAG} entry; this probe plays {TAG}")
  run(config, FLAGS.model_dir or make_default.DEFAULT_DIR, FLAGS.labels, FLAGS.eval_every,
      FLAGS.batch_size, FLAGS.learning_rate, FLAGS.probe_seed, FLAGS.generations)


if __name__ == "__main__":
  flags.DEFINE_string("model_dir", None, "HF model directory (default: the shipped default)")
  flags.DEFINE_integer("labels", 32768, "labelled states to train on")
  flags.DEFINE_integer("eval_every", 8192, "labels between evaluations")
  flags.DEFINE_integer("batch_size", 64, "labels per Adam step")
  flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate (constant after 10 warmup steps)")
  flags.DEFINE_integer("probe_seed", 0, "seed of the training and held-out states")
  flags.DEFINE_integer("generations", 1, "validation generations played at each evaluation")
  app.run(main, flags_parser=cli.parse_flags)
