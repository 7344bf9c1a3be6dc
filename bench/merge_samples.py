"""Training each copy of a repeated step sample vs one merged, weighted sample.

    python bench/merge_samples.py --config=configs/frozenlake.py
    python bench/merge_samples.py --config=configs/frozenlake.py --config.pretrain=DIR
    python bench/merge_samples.py --quick    # `make bench`: frozenlake, 4 groups, 1 batch

Builds the config's AgenticPipeline (JetStream server, Ray env workers), collects
`--batches` real rollout batches from the policy (`pretrain`: the default model, or a
trained one, whose groups repeat more), then runs the step's learning phase
(rollx.trainer.learner's `Learner.learn`: old and reference log-probs, the actor's
minibatch updates with the trust region) on each batch with `merge_identical_samples`
off (baseline) and on, rounds alternated, every call from the same saved actor state.
The figure is the ratio baseline / merged time (> 1: merging is faster), with the
fraction of distinct samples. Exactness is a test (tests/trainer/test_packing.py), not measured here.
"""

import os
import sys
import tempfile
import time

from absl import app, flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rollx import checks, cli  # noqa: E402  (cli defines --config)

flags.DEFINE_integer("batches", 3, "rollout batches to collect")
flags.DEFINE_integer("rounds", 3, "timed rounds over every batch, per setting")
flags.DEFINE_bool("quick", False, "1 batch of 4 groups, 1 round; without --config, "
                  "configs/frozenlake.py (make bench)")
FLAGS = flags.FLAGS
QUICK_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "configs", "frozenlake.py")


def main(argv):
  del argv
  from rollx.pipeline import AgenticPipeline
  if FLAGS.quick and cli.CONFIG.value is None:
    FLAGS["config"].parse(QUICK_CONFIG)
  config = cli.load_config()
  config.eval_steps = 1_000_000  # no validation rollouts
  out = tempfile.mkdtemp()  # checkpoints, logs: nothing of the user's output_dir touched
  config.output_dir, config.logging_dir = out, os.path.join(out, "logs")
  config.render_save_dir = os.path.join(out, "render")
  if FLAGS.quick:
    FLAGS.batches, FLAGS.rounds = 1, 1
    groups = min(4, config.train_env_manager.num_env_groups)
    config.train_env_manager.num_env_groups = groups
    config.rollout_batch_size = groups * config.train_env_manager.group_size
    config.min_informative_groups = min(config.min_informative_groups, groups)
    config = checks.validate(config)
  pipeline = AgenticPipeline(config)
  try:
    batches = [pipeline.collect({}) for _ in range(FLAGS.batches)]
    saved = jax.tree.map(lambda x: x.copy(), pipeline.learner.actor_state)

    def learn(merge: bool, b) -> tuple:
      config.merge_identical_samples = merge
      pipeline.learner.actor_state = jax.tree.map(lambda x: x.copy(), saved)
      metrics = {}
      t = time.perf_counter()
      pipeline.learner.learn(*b, pipeline.step, metrics)
      jax.block_until_ready(pipeline.learner.actor_state)
      return time.perf_counter() - t, metrics

    for b in batches:  # compile every shape both settings meet
      learn(False, b)
      learn(True, b)
    times = {False: [], True: []}
    distinct, rows = [], {False: [], True: []}
    for _ in range(FLAGS.rounds):
      for b in batches:
        for merge in (False, True):
          dt, m = learn(merge, b)
          times[merge].append(dt)
          rows[merge].append(m["packing/rows"])
          if merge:
            distinct.append(m["packing/distinct_samples"])
    base, new = np.median(times[False]), np.median(times[True])
    print(f"{config.pretrain or 'default model'}: {FLAGS.batches} batches, "
          f"{np.mean([len(b[1]['input_ids']) for b in batches]):.0f} samples kept per batch, "
          f"distinct {np.mean(distinct):.2f}; rows {np.mean(rows[False]):.0f} -> "
          f"{np.mean(rows[True]):.0f}")
    print(f"learn phase: every copy {base:.3f} s, merged {new:.3f} s (median of "
          f"{len(times[True])}): ratio {base / new:.2f}x")
  finally:
    pipeline.close()


if __name__ == "__main__":
  from rollx import hostmem
  hostmem.reexec_with_tuned_malloc()  # as rollx.train does
  app.run(main)
