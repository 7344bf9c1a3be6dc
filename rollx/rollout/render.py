"""Rendered frames of validation episodes: a PNG per step and a GIF per episode."""

from __future__ import annotations

import os
from typing import List, Sequence

from PIL import Image

from rollx.rollout.types import Trajectory


def save_episode_frames(trajectories: Sequence[Trajectory], out_dir: str,
                        max_episodes: int = 4, frame_ms: int = 500) -> List[str]:
  """Writes `<out_dir>/<tag>_g<group>_n<gen>/step_<k>.png` and `episode.gif` for the
  first `max_episodes` trajectories that carry frames; returns the GIF paths."""
  gifs = []
  for t in [t for t in trajectories if t.frames][:max_episodes]:
    name = f"{t.ticket.tag}_g{t.ticket.group_id}_n{t.ticket.generation}_e{t.ticket.env_id}"
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    images = [Image.fromarray(f) for f in t.frames]
    for k, image in enumerate(images):
      image.save(os.path.join(folder, f"step_{k:03d}.png"))
    gif = os.path.join(folder, "episode.gif")
    images[0].save(gif, save_all=True, append_images=images[1:], duration=frame_ms, loop=0)
    gifs.append(gif)
  return gifs
