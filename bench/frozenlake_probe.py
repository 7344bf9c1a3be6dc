"""FrozenLake capacity probe: can a model learn the task when told the answer?

    python bench/frozenlake_probe.py --config=configs/frozenlake.py [--model_dir=DIR]

RL on configs/frozenlake.py levels off where a policy that walks towards G and
ignores holes does (bench/frozenlake_policies.py). Is that the reward signal, or the
model? This probe removes RL: it trains the model (by default the shipped
`rollx/models/default`) by supervised next-token loss on states of random training
maps, each answered with one of its shortest-path moves (the prompt the rollouts
build, then `<answer>Move</answer>`), and every `--eval_every` labels reports
- trap accuracy: on held-out states where walking towards G (the first such move,
  holes ignored) steps into a hole, the share where the model's top move starts a
  shortest path (what the hole check buys);
- accuracy: the same share on all held-out states;
- hole check: on held-out states with a hole next to the player, the model's
  probability of a move into a hole (over the four moves), next to the share of such
  moves (what a policy blind to holes puts there);
- greedy success on the validation levels, played through the rollouts' EnvManager
  (`bench/frozenlake_policies.play_model`), and its ratio to random moves on the same
  levels (same process); the reference policies of that bench close the report.
A variant architecture (`--layers` / `--heads` / `--rope_theta`) is built and warm
started the way the default is (`rollx.models.make_default.build`, ~12-20 min on 2
cores) before the probe. A model whose probe curve stalls at the towards-G level
cannot be expected to pass it by RL. `--labels=0` measures a model as it is (e.g. the
export of an RL run: has it learned the hole check, or only to walk towards G?).
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from typing import List

from absl import app, flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollx import cli  # noqa: E402  (defines --config)

FLAGS = flags.FLAGS
TAG = "FrozenLake"


def labelled_states(config, tokenizer, num: int, seed: int):
  """`num` states visited by a half-optimal, half-random walker on random maps: (ids,
  segment ids, [(answer position, shortest-path moves)], is-trap, [moves into a hole]),
  labelled with one shortest-path move drawn at random. A trap: the first move towards G
  (holes ignored, `frozenlake_policies.toward_goal`) steps into a hole."""
  import envs
  from bench import frozenlake_policies as ref
  from rollx.rollout import prompts
  entry = config.custom_envs[TAG]
  env = envs.make_env(entry.env_type, entry.env_config.to_dict())
  builder = prompts.builder_for(entry, env, tokenizer)
  rng = random.Random(seed)
  rows, moves, traps, holes = [], [], [], []
  while len(rows) < num:
    env.reset(seed=rng.randrange(2**31))
    while len(rows) < num:
      desc, pos = list(env.desc), env.position
      best = ref.shortest_moves(desc, pos)
      towards = ref._after(desc, pos, ref.toward_goal(desc, pos, rng))
      prompt = builder.first_prompt(env.render_text(), env.actions_left)
      rows.append(answer_row(tokenizer, prompt, rng.choice(best)))
      moves.append((len(prompt) + 1, best))
      traps.append(desc[towards[0]][towards[1]] == "H")
      holes.append(ref.hole_moves(desc, pos))
      act = rng.choice(best) if rng.random() < 0.5 else rng.choice(list(ref.MOVES))
      _, _, terminated, truncated, _ = env.step(f"<answer>{act}</answer>")
      if terminated or truncated:
        break
  return (*pad_rows(rows), moves, np.asarray(traps), holes)


def answer_row(tokenizer, prompt, move: str) -> List[int]:
  """The prompt answered with `<answer>move</answer><eos>`; the move token sits at
  len(prompt) + 1, right after `<answer>`."""
  answer = tokenizer.encode(f"<answer>{move}</answer>", add_special_tokens=False)
  return list(prompt) + list(answer) + [tokenizer.eos_token_id]


def pad_rows(rows: List[List[int]]):
  """Token rows -> (ids, segment ids), zero-padded to the longest row."""
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int32)
  seg = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)], seg[i, :len(r)] = r, 1
  return ids, seg


class SupervisedProbe:
  """The loop every probe shares: a model trained by next-token loss on labelled answers
  (`<answer>Move</answer><eos>` after the rollouts' prompt), read where it predicts the
  move. `answer_at[i]` is the position of row i's move token."""

  def __init__(self, model_dir: str, move_names, steps: int, batch_size: int,
               learning_rate: float):
    import jax
    from rollx import config as rollx_config, models
    from rollx.models import hf, llm, warm_start
    from rollx.parallel import mesh as mesh_lib
    from rollx.trainer.step import Trainer
    self.loaded = models.load_model(model_dir)
    self.tokenizer = hf.load_tokenizer(model_dir)
    self.move_ids = [self.tokenizer.encode(m, add_special_tokens=False)[0] for m in move_names]
    self.batch_size = batch_size
    worker = rollx_config.default_config().actor_train
    worker.training_args.update(learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                                warmup_steps=10, lr_scheduler_type="constant")
    worker.strategy_args.update(dp_size=1)
    worker.model_args.disable_gradient_checkpointing = True
    mesh = mesh_lib.make_mesh(worker.strategy_args, None, "probe")
    self.trainer = Trainer(self.loaded.config, worker, mesh, warm_start._lm_loss, max(steps, 1))
    self.state = self.trainer.init_state(jax.device_get(self.loaded.params))
    self._forward = jax.jit(lambda p, x, s: llm.forward(self.trainer.model, p, x, s))

  def move_probs(self, params, ids, seg, answer_at) -> np.ndarray:
    """[rows, moves]: the model's probability of each move (renormalised over the moves)."""
    import jax.numpy as jnp
    logits = np.asarray(self._forward(params, jnp.asarray(ids), jnp.asarray(seg)))
    move_logits = np.stack([logits[i, at - 1, self.move_ids] for i, at in enumerate(answer_at)])
    p = np.exp(move_logits - move_logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)

  def export(self, params, out_dir: str) -> None:
    import jax
    from rollx.models import hf
    hf.save_pretrained(jax.device_get(params), self.loaded.config, out_dir, tokenizer=self.tokenizer)

  def fit(self, ids, seg, answer_at, seed: int, eval_every: int, evaluate) -> List[dict]:
    """Adam steps over the rows in order; `evaluate(params, labels_seen)` at 0, every
    `eval_every` labels and at the end. Returns its rows."""
    import jax
    import jax.numpy as jnp
    mask = np.zeros(ids.shape, np.float32)
    for i, at in enumerate(answer_at):
      # the whole answer (tags and EOS too): a loss on the move alone teaches the model to
      # name a move wherever it predicts, and it never closes the tag again
      mask[i, at - 1:] = seg[i, at - 1:]
    steps, bs = len(ids) // self.batch_size, self.batch_size
    results = [evaluate(self.state.params, 0)]
    rng = jax.random.PRNGKey(seed)
    start = time.time()
    for step in range(steps):
      rows = slice(step * bs, (step + 1) * bs)
      batch = self.trainer.batch_sharding({"input_ids": jnp.asarray(ids[rows]),
                                           "segment_ids": jnp.asarray(seg[rows]),
                                           "loss_mask": jnp.asarray(mask[rows])})
      rng, key = jax.random.split(rng)
      self.state, _ = self.trainer.update(self.state, batch, key)
      seen = (step + 1) * bs
      if seen % eval_every == 0 or step == steps - 1:
        results.append(evaluate(self.state.params, seen))
    print(f"{steps} steps in {time.time() - start:.0f} s", flush=True)
    return results


def run(config, model_dir: str, labels: int, eval_every: int, batch_size: int,
        learning_rate: float, seed: int, val_generations: int) -> List[dict]:
  from bench import frozenlake_policies as ref

  names = list(ref.MOVES)
  probe = SupervisedProbe(model_dir, names, labels // batch_size, batch_size, learning_rate)
  ids, seg, moves, _, _ = labelled_states(config, probe.tokenizer, max(labels, 1), seed)
  test_ids, test_seg, test_moves, test_traps, test_holes = labelled_states(
      config, probe.tokenizer, 2048, seed + 1)
  near_hole = np.asarray([bool(h) for h in test_holes])
  val_seeds = ref.validation_seeds(config, val_generations)
  random_success = ref.play_reference(config, ref.random_move, val_seeds)

  def evaluate(params, seen):
    # the four moves' probabilities where the answer's move is predicted: top move, and
    # the probability of stepping into a hole
    p_move = probe.move_probs(params, test_ids, test_seg, [at for at, _ in test_moves])
    pick = [names[int(k)] for k in np.argmax(p_move, axis=1)]
    correct = np.asarray([pick[i] in best for i, (_, best) in enumerate(test_moves)])
    p_hole = np.asarray([sum(p_move[i, names.index(m)] for m in h) for i, h in enumerate(test_holes)])
    blind = np.asarray([len(h) / len(names) for h in test_holes])
    with tempfile.TemporaryDirectory() as out:
      probe.export(params, out)
      success, _ = ref.play_model(config.copy_and_resolve_references(), out, val_seeds)
    row = dict(labels=seen, trap_acc=float(correct[test_traps].mean()),
               acc=float(correct.mean()), p_hole=float(p_hole[near_hole].mean()),
               p_hole_blind=float(blind[near_hole].mean()), val_success=success,
               ratio=success / max(random_success, 1e-9))
    print(f"labels {seen:6d}  trap acc {row['trap_acc']:.3f}  acc {row['acc']:.3f}  "
          f"p(hole move) {row['p_hole']:.3f} (blind {row['p_hole_blind']:.3f}, "
          f"{int(near_hole.sum())} states)  val success {success:.3f} "
          f"({row['ratio']:.1f}x random)", flush=True)
    return row

  results = probe.fit(ids[:labels], seg[:labels], [at for at, _ in moves[:labels]], seed,
                      eval_every, evaluate)
  print("references on the same levels: " +
        ", ".join(f"{name} {ref.play_reference(config, policy, val_seeds):.3f}"
                  for name, policy in ref.REFERENCE.items()))
  return results


def main(argv):
  del argv
  from rollx.models import make_default
  config = cli.load_config()
  if TAG not in config.custom_envs:
    cli.fail(f"--config: no custom_envs.{TAG} entry; this probe plays FrozenLake")
  model_dir = FLAGS.model_dir or make_default.DEFAULT_DIR
  if FLAGS.layers or FLAGS.heads or FLAGS.rope_theta:
    model_dir = tempfile.mkdtemp(prefix="probe_model_")
    make_default.build(model_dir, layers=FLAGS.layers or make_default.LAYERS,
                       heads=FLAGS.heads or make_default.HEADS,
                       rope_theta=FLAGS.rope_theta or make_default.ROPE_THETA)
    print(f"built {model_dir}", flush=True)
  run(config, model_dir, FLAGS.labels, FLAGS.eval_every, FLAGS.batch_size, FLAGS.learning_rate,
      FLAGS.probe_seed, FLAGS.generations)


if __name__ == "__main__":
  flags.DEFINE_string("model_dir", None, "HF model directory (default: the shipped default)")
  flags.DEFINE_integer("layers", 0, "build and warm start a default-like model with this many layers")
  flags.DEFINE_integer("heads", 0, "... and this many attention heads (head_dim = hidden / heads)")
  flags.DEFINE_float("rope_theta", 0.0, "... and this RoPE base")
  flags.DEFINE_integer("labels", 32768, "labelled states to train on")
  flags.DEFINE_integer("eval_every", 8192, "labels between evaluations")
  flags.DEFINE_integer("batch_size", 64, "labels per Adam step")
  flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate (constant after 10 warmup steps)")
  flags.DEFINE_integer("probe_seed", 0, "seed of the training and held-out states")
  flags.DEFINE_integer("generations", 2, "validation generations played at each evaluation")
  app.run(main, flags_parser=cli.parse_flags)
