"""Learning curve: validation success against wall time, one training run.

    python -m rollx.curve --config=configs/frozenlake.py --minutes=30 --seed=1
    python -m rollx.curve --config=configs/frozenlake.py --config.adv_estimator=gae \
        --config.drop_zero_advantage_samples=False --config.episode_reward_gamma=1.0 ...

Runs the real pipeline (Ray env workers, JetStream server, sharded train step)
for a wall-clock budget, counting from before the pipeline is built (startup
included), and prints one line per validation: minutes, step, greedy success on
unseen levels. The figure is relative to the run's own start: the warm-started
policy's validation success at step 0 is the baseline, the final line prints
the ratio. `--out` writes the curve as CSV and PNG (the README picture; `plot` draws
several runs' curves into one). The slow learning tests (tests/test_learning.py) run
`learning_curve`.
"""

from __future__ import annotations

import csv
import time

from absl import app, flags

from rollx import cli  # defines --config

FLAGS = flags.FLAGS


def learning_curve(config, minutes: float, log=print):
  """[(minutes, step, val_success, train_success, val_score)] for one run of `config`
  (val_score: the validation episodes' mean score, format penalties included)."""
  from rollx.pipeline import AgenticPipeline
  start = time.time()
  pipeline = AgenticPipeline(config)
  pipeline.tracker.set_budget(minutes * 60, start)  # not 13/100000: max_steps is a stand-in
  curve = []

  def on_step(step, metrics):
    elapsed = (time.time() - start) / 60
    if "val_success" in metrics:
      # the validation ran at the start of this step, on the weights of the step before
      scores = [v for k, v in metrics.items() if k.startswith("val/") and k.endswith("/score_mean")]
      val_score = sum(scores) / len(scores)
      curve.append((elapsed, step, metrics["val_success"], metrics["success"], val_score))
      log(f"{elapsed:6.2f} min  step {step:4d}  val_success {metrics['val_success']:.3f}  "
          f"val_score {val_score:+.3f}  "
          f"train_success {metrics['success']:.3f}  entropy {metrics['entropy']:.3f}  "
          f"step_s {metrics['time/step']:.1f}")
    return elapsed >= minutes

  pipeline.run(on_step)
  return curve


def plot(curves, path: str, title: str, minutes: float, refs=(), bar=0.8,
         legend_top: bool = False, ylim=(0.0, 1.0)) -> None:
  """Validation success (each curve row's third value) vs minutes, one line per run (PIL:
  no plotting dependency); `refs`: (label, success) levels drawn as dotted lines (e.g. a
  reference policy's); `bar`: the grid line drawn darker (FrozenLake's 0.8 target; None
  for no target); `legend_top`: the legend at the top right, for curves that stay low
  (Sokoban); `ylim`: the value range drawn (a score below 0, say)."""
  from PIL import Image, ImageDraw
  w, h, left, bottom, top, right = 640, 360, 50, 40, 30, 20
  img = Image.new("RGB", (w, h), "white")
  d = ImageDraw.Draw(img)
  lo, hi = ylim
  x = lambda m: left + (w - left - right) * m / minutes
  y = lambda v: h - bottom - (h - bottom - top) * (v - lo) / (hi - lo)
  for v in (lo + (hi - lo) * i / 5 for i in range(6)):
    major = bar is not None and abs(v - bar) < 1e-9
    d.line([(left, y(v)), (w - right, y(v))], fill=(150, 150, 150) if major else (230, 230, 230))
    d.text((8, y(v) - 6), f"{v:.1f}", fill="black")
  for label, level in refs:
    for x0 in range(left, w - right, 8):
      d.line([(x0, y(level)), (x0 + 3, y(level))], fill=(90, 90, 90))
    # at the left, where the curves are still low; under the line unless it is near the
    # top (the 0.8 bar line sits just above levels like 0.77)
    d.text((left + 10, y(level) - 14 if level > 0.85 else y(level) + 2),
           label, fill=(90, 90, 90))
  for m in range(0, int(minutes) + 1, 5):
    d.text((x(m) - 6, h - bottom + 6), str(m), fill="black")
  colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
            (140, 86, 75)]
  # legend bottom right: late in a run the curves are high (top left, where they start
  # low, fills up once several runs rise fast)
  width = max((d.textlength(label) for label, _ in curves), default=0)
  for i, (label, curve) in enumerate(curves):
    pts = [(x(c[0]), y(c[2])) for c in curve]
    if len(pts) > 1:
      d.line(pts, fill=colors[i % len(colors)], width=2)
    row = top + 8 + 14 * i if legend_top else h - bottom - 8 - 14 * (len(curves) - i)
    d.text((w - right - 10 - width, row), label, fill=colors[i % len(colors)])
  d.text((left, 8), title, fill="black")
  d.text((w // 2 - 90, h - 18), "wall-clock minutes, 2 CPU cores", fill="black")
  img.save(path)


def main(argv):
  del argv
  config = cli.load_config()
  cli.quiet_console()  # as rollx.train: no library INFO records; --verbosity=0 shows them
  if FLAGS.seed is not None:
    config.seed = FLAGS.seed
  config.max_steps = 100_000  # the budget stops it
  curve = learning_curve(config, FLAGS.minutes)
  first = next((m for m, _, v, *_ in curve if v >= 0.8), None)
  base = curve[0][2]
  print(f"seed {config.seed}: val_success {base:.3f} at start -> {curve[-1][2]:.3f} at "
        f"{curve[-1][0]:.1f} min (ratio {curve[-1][2] / max(base, 1e-3):.1f}x vs the "
        f"warm start); first >= 0.8 at "
        f"{'%.1f min' % first if first is not None else 'never'}; min after that "
        f"{min((v for m, _, v, *_ in curve if first is not None and m >= first), default=float('nan')):.3f}; "
        f"val_score {curve[0][4]:+.3f} -> {curve[-1][4]:+.3f}")
  if FLAGS.out:
    with open(FLAGS.out + ".csv", "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["minutes", "step", "val_success", "train_success", "val_score"])
      w.writerows(curve)
    plot([(f"seed {config.seed}", curve)], FLAGS.out + ".png",
         f"{config.exp_name}: validation success (unseen maps, greedy)", FLAGS.minutes)


if __name__ == "__main__":
  from rollx import hostmem
  hostmem.reexec_with_tuned_malloc()  # as rollx.train does
  # flags only when run as a script (tests import learning_curve)
  flags.DEFINE_float("minutes", 30.0, "wall-clock budget, startup included")
  flags.DEFINE_integer("seed", None, "overrides config.seed")
  flags.DEFINE_string("out", None, "write <out>.csv and <out>.png")
  app.run(main, flags_parser=cli.parse_flags)
