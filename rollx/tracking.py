"""Metrics to TensorBoard (tensorboardX), transcripts as text, frames as images; the console.

The console (`Tracker.console`): one line per step on stdout,

    step 1/200 [00:45, first step: startup and compilation] score=0.102 ...
    step 12/200 [01:12<08:02, 2.57s/step] score=0.412 success=0.406 kl=0.004 ...

with the run's elapsed time, time left and rate, both measured from the end of the first
step (whose time is mostly compilation, so counting it would skew them); a run with a
wall-clock budget (`set_budget`, rollx.curve's `--minutes`) shows time against its budget
instead, `step 13 [11:17 of 35:00, 23:43 left, 52.10s/step]`; one line per validation,

    val @ 10/200 FrozenLake success=0.617 (95% CI 0.530-0.697, n=128) score=0.532 invalid=0.000

and, on a terminal, tqdm's progress bar on stderr below them (`make train`; piped or
redirected output gets the lines only).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Dict, Iterable, Optional, Tuple

import numpy as np
from tensorboardX import SummaryWriter
from tqdm import tqdm

CONSOLE_KEYS = ("score", "success", "kl", "entropy", "loss", "tokens_per_s")
_FIRST = "first step: startup and compilation"


def wilson_interval(successes: float, n: int, z: float = 1.96) -> Tuple[float, float]:
  """The Wilson score interval of a binomial proportion (95% at z=1.96): unlike the
  normal approximation it stays within [0, 1] and is not degenerate at 0 or n."""
  if n <= 0:
    return 0.0, 1.0
  p = successes / n
  denom = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denom
  half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
  return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased pass@k estimate of one problem from n samples of which c passed
  (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"):
  1 - C(n-c, k) / C(n, k), computed as a stable product."""
  if not 1 <= k <= n:
    raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
  if n - c < k:
    return 1.0
  return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


class Tracker:

  def __init__(self, logging_dir: str, max_steps: int, enabled: bool = True):
    self.writer = SummaryWriter(logging_dir) if enabled else None
    self.logging_dir, self.files = logging_dir, 1
    self.max_steps, self.start = max_steps, time.time()
    self.first_step: Optional[int] = None  # the run's first step (> 0 when resumed)
    self.first_done: Optional[float] = None  # when it ended: later rates start there
    self.budget_s: Optional[float] = None
    self.bar: Optional[tqdm] = None
    self.show_bar = enabled and sys.stderr.isatty()

  def scalars(self, step: int, metrics: Dict[str, float]) -> None:
    if self.writer is None:
      return
    for k, v in metrics.items():
      if v is not None and np.isfinite(v):
        self.writer.add_scalar(k, float(v), step)
    self.writer.flush()

  def transcripts(self, step: int, trajectories: Iterable, tokenizer, limit: int = 3) -> None:
    if self.writer is None:
      return
    for i, t in enumerate(list(trajectories)[:limit]):
      text = tokenizer.decode(t.samples[-1].input_ids) if t.samples else ""
      self.writer.add_text(f"transcript/{t.ticket.tag}/{i}",
                           f"score {t.score:+.2f} success {t.success}\n\n```\n{text}\n```", step)

  def frames(self, step: int, trajectories: Iterable, limit: int = 2) -> None:
    if self.writer is None:
      return
    for i, t in enumerate([t for t in trajectories if t.frames][:limit]):
      images = np.stack(t.frames).transpose(0, 3, 1, 2)  # NCHW
      self.writer.add_images(f"val_episode/{t.ticket.tag}/{i}", images, step)

  def set_budget(self, seconds: float, start: Optional[float] = None) -> None:
    """A run that ends on a wall-clock budget (from `start`, default this tracker's) rather
    than at max_steps: the console shows time against the budget."""
    self.budget_s = float(seconds)
    if start is not None:
      self.start = start

  def console(self, step: int, metrics: Dict[str, float]) -> None:
    """The validation line (when `metrics` has validation results) and the step line
    of step index `step`; on a terminal the progress bar moves on."""
    now = time.time()
    first = self.first_step is None
    if first:
      self.first_step, self.first_done = step, now
      if self.show_bar:
        total, unit = ((int(self.budget_s), "s") if self.budget_s else (self.max_steps, "step"))
        self.bar = tqdm(total=total, unit=unit, desc="train", file=sys.stderr,
                        dynamic_ncols=True, leave=False,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {postfix}")
    val = validation_line(step, self.max_steps, metrics)
    if val:
      self._write(val)
    meter = self._meter(step, now, first)
    shown = " ".join(f"{k}={metrics[k]:.3f}" for k in CONSOLE_KEYS if k in metrics)
    self._write(f"step {meter} {shown}")
    if self.bar is not None:
      self.bar.n = min(self.bar.total, int(now - self.start) if self.budget_s else step + 1)
      self.bar.set_postfix_str(meter)

  def _meter(self, step: int, now: float, first: bool) -> str:
    """`N/total [elapsed<left, rate]`, or against the budget; the first step's time is
    named as what it mostly is."""
    elapsed = tqdm.format_interval(now - self.start)
    done = step - self.first_step  # steps since the first one ended
    rate = (now - self.first_done) / done if done else None
    rate_text = "" if rate is None else (f"{rate:.2f}s/step" if rate >= 1 else
                                         f"{1 / max(rate, 1e-9):.2f}step/s")
    if self.budget_s:
      left = tqdm.format_interval(max(0.0, self.budget_s - (now - self.start)))
      tail = _FIRST if first else rate_text
      return (f"{step + 1} [{elapsed} of {tqdm.format_interval(self.budget_s)}, "
              f"{left} left, {tail}]")
    if first:
      return f"{step + 1}/{self.max_steps} [{elapsed}, {_FIRST}]"
    left = tqdm.format_interval(rate * (self.max_steps - step - 1))
    return f"{step + 1}/{self.max_steps} [{elapsed}<{left}, {rate_text}]"

  def _write(self, line: str) -> None:
    tqdm.write(line, file=sys.stdout)  # above the bar, which is redrawn below it
    sys.stdout.flush()

  def sync(self) -> None:
    """Puts everything logged so far on disk (the pipeline calls it before each checkpoint,
    so a run killed after it loses no step that its resumed run will not redo).
    tensorboardX's flush() leaves the events still queued for its writer thread in memory;
    closing the writer drains them. Logging goes on in a new event file (numbered: two
    files made in the same second would otherwise share a name)."""
    if self.writer is None:
      return
    self.writer.close()
    self.files += 1
    self.writer = SummaryWriter(self.logging_dir, filename_suffix=f".{self.files}")

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None
    if self.writer is not None:
      self.writer.close()


def validation_line(step: int, max_steps: int, metrics: Dict[str, float]) -> str:
  """`val @ step/max_steps` and per env tag its success rate with a 95% Wilson interval,
  mean score and invalid-action rate; '' when `metrics` holds no validation."""
  tags = sorted(k[len("val/"):-len("/success")] for k in metrics
                if k.startswith("val/") and k.endswith("/success") and k.count("/") == 2)
  parts = []
  for tag in tags:
    m = {k[len(f"val/{tag}/"):]: v for k, v in metrics.items() if k.startswith(f"val/{tag}/")}
    n = int(m.get("num_episodes", 0))
    low, high = wilson_interval(m["success"] * n, n)
    parts.append(f"{tag} success={m['success']:.3f} (95% CI {low:.3f}-{high:.3f}, n={n}) "
                 f"score={m.get('score_mean', float('nan')):.3f} "
                 f"invalid={m.get('invalid_action_rate', float('nan')):.3f}")
  return f"val @ {step}/{max_steps} " + " | ".join(parts) if parts else ""
