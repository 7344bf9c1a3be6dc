"""Metrics to TensorBoard (tensorboardX), transcripts as text, frames as images, a console line."""

from __future__ import annotations

import sys
import time
from typing import Dict, Iterable

import numpy as np
from tensorboardX import SummaryWriter

CONSOLE_KEYS = ("score", "success", "val_success", "kl", "entropy", "loss", "tokens_per_s")


class Tracker:

  def __init__(self, logging_dir: str, max_steps: int, enabled: bool = True):
    self.writer = SummaryWriter(logging_dir) if enabled else None
    self.logging_dir, self.files = logging_dir, 1
    self.max_steps, self.start = max_steps, time.time()

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

  def console(self, step: int, metrics: Dict[str, float]) -> None:
    shown = " ".join(f"{k}={metrics[k]:.3f}" for k in CONSOLE_KEYS if k in metrics)
    done = (step + 1) / self.max_steps
    bar = "#" * int(20 * done) + "." * (20 - int(20 * done))
    print(f"[{bar}] step {step + 1}/{self.max_steps} {time.time() - self.start:6.0f}s {shown}",
          file=sys.stdout, flush=True)

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
    if self.writer is not None:
      self.writer.close()
