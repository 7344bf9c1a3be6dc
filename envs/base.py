"""The text-env protocol every rollx environment follows.

    obs, info = env.reset(seed)
    obs, reward, terminated, truncated, info = env.step(response_text)
    frame = env.render("text") | env.render("rgb_array")

`step` takes the model's raw response. The base class parses it with the
configured `action_pattern`; a response that names no valid action is an invalid
action: the state does not change, the reward is the env's `format_penalty`, and
`info["action_is_valid"]` is False. It counts towards `max_steps` like any action,
so a model that never answers well still ends its episode. A valid action that
leaves the observation as it was (a move into a wall) has `info["action_is_effective"]`
False (RAGEN's name): a greedy history-free policy repeats such a move until
`max_steps`, and counting them tells those episodes apart in the metrics. With
`ineffective_action_ends_episode` such a move ends the episode instead (terminated,
not a success, the move's own reward): what a greedy history-free policy's episode
comes to anyway, since the same prompt gets the same answer until `max_steps`.
An env whose actions share a verb may name each valid action's kind in
`info["action_kind"]` (WebShop: a click on a product, an option, Buy Now); the
rollout metrics count action shares by it (`<tag>/action_share/<kind>`).

Subclasses provide `ACTIONS`, a dataclass `Config` (extending `TextEnvConfig`),
and four hooks: `_new_episode(seed)`, `_apply(action)`, `render_text()`,
`render_rgb()`; plus `instructions` for the prompt. Grid games whose rules ignore
orientation also list `SYMMETRIES` and implement `symmetric_view` (envs.symmetry).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Optional, Sequence, Tuple

import gymnasium
import numpy as np

from envs import parsing

RENDER_MODES = ("text", "rgb_array")


@dataclasses.dataclass
class TextEnvConfig:
  max_steps: int = 10  # actions per episode, invalid ones included; then truncated
  format_penalty: float = -0.1  # reward of an invalid (unparseable) action
  # A valid action that changes nothing (a move into a wall) ends the episode, a failure.
  ineffective_action_ends_episode: bool = False
  action_pattern: str = parsing.DEFAULT_ACTION_PATTERN  # one capture group


class TextEnv(gymnasium.Env):
  """Base class: parsing, invalid actions, step budget, gymnasium plumbing."""

  ACTIONS: ClassVar[Tuple[str, ...]] = ()
  Config: ClassVar[type] = TextEnvConfig
  MAX_OBSERVATION_CHARS: ClassVar[int] = 4096
  env_type: ClassVar[str] = ""  # set by @register_env
  metadata = {"render_modes": list(RENDER_MODES), "render_fps": 4}

  def __init__(self, config: Optional[TextEnvConfig] = None,
               render_mode: Optional[str] = None):
    self.config = config if config is not None else self.Config()
    if render_mode is not None and render_mode not in RENDER_MODES:
      raise ValueError(f"render_mode must be one of {RENDER_MODES}, got {render_mode!r}")
    if self.config.max_steps < 1:
      raise ValueError(f"max_steps must be >= 1, got {self.config.max_steps}")
    parsing.compile_action_pattern(self.config.action_pattern)
    self.check_config()
    self.render_mode = render_mode
    self.action_space = gymnasium.spaces.Text(max_length=parsing.MAX_RESPONSE_CHARS)
    self.observation_space = gymnasium.spaces.Text(
        max_length=self.MAX_OBSERVATION_CHARS, charset=self.observation_charset())
    self.num_steps = 0
    self.num_invalid_actions = 0
    self.num_ineffective_actions = 0
    self.done = True
    self.success = False

  # -- hooks ---------------------------------------------------------------
  def check_config(self) -> None:
    """Raises ValueError naming the field for a config this env cannot run."""

  def observation_charset(self) -> str:
    raise NotImplementedError

  def parse(self, action_text) -> Optional[str]:
    """The canonical action `action_text` names, or None (an invalid action). Envs with
    a fixed action set keep this; envs whose actions take arguments override it."""
    return parsing.parse_action(action_text, self.ACTIONS, self.config.action_pattern)

  def _new_episode(self, seed: int) -> None:
    """Builds the level for `seed` (same seed -> same level)."""
    raise NotImplementedError

  def _apply(self, action: str) -> Tuple[float, bool, bool]:
    """Applies a valid action; returns (reward, terminated, success)."""
    raise NotImplementedError

  def render_text(self) -> str:
    raise NotImplementedError

  def render_rgb(self) -> np.ndarray:
    raise NotImplementedError

  @property
  def instructions(self) -> str:
    """The game's rules, symbols and answer format, for the system/first prompt."""
    raise NotImplementedError

  # Board symmetries (names in envs.symmetry.TRANSFORMS) under which this is the same
  # game; `symmetric_view` shows a decision through them.
  SYMMETRIES: ClassVar[Tuple[str, ...]] = ()

  def symmetric_view(self, observation: str, action: Optional[str],
                     transform: str) -> Tuple[str, Optional[str]]:
    """An observation this env rendered, and the valid action taken on it (None for an
    invalid answer), as they read on the board seen through `transform`."""
    raise NotImplementedError(f"{type(self).__name__} has no board symmetries")

  # -- protocol ------------------------------------------------------------
  def reset(self, seed: Optional[int] = None,
            options: Optional[Dict[str, Any]] = None) -> Tuple[str, Dict[str, Any]]:
    super().reset(seed=seed)
    if seed is None:
      seed = int(self.np_random.integers(0, 2**31 - 1))
    self._new_episode(int(seed))
    self.num_steps = 0
    self.num_invalid_actions = 0
    self.num_ineffective_actions = 0
    self.done = False
    self.success = False
    return self.render_text(), {"seed": int(seed), "actions_left": self.actions_left}

  def step(self, action_text) -> Tuple[str, float, bool, bool, Dict[str, Any]]:
    if self.done:
      raise RuntimeError(f"{type(self).__name__}.step() called on a finished "
                         "episode; call reset() first")
    action = self.parse(action_text)
    self.num_steps += 1
    if action is None:
      self.num_invalid_actions += 1
      reward, terminated = float(self.config.format_penalty), False
      before = None
    else:
      before = self.render_text()
      reward, terminated, self.success = self._apply(action)
    obs = self.render_text()
    effective = action is not None and (terminated or obs != before)
    ineffective = action is not None and not effective  # valid, and nothing changed
    self.num_ineffective_actions += ineffective
    if ineffective and self.config.ineffective_action_ends_episode:
      terminated = True  # not a success: _apply reported none, or it would have terminated
    truncated = not terminated and self.num_steps >= self.config.max_steps
    self.done = terminated or truncated
    info = {
        "action_is_valid": action is not None,
        "action_is_effective": effective,
        "action": action,
        "success": bool(self.success),
        "actions_left": self.actions_left,
        "num_invalid_actions": self.num_invalid_actions,
        "num_ineffective_actions": self.num_ineffective_actions,
    }
    return obs, float(reward), bool(terminated), bool(truncated), info

  def render(self, mode: Optional[str] = None):
    mode = mode or self.render_mode or "text"
    if mode == "text":
      return self.render_text()
    if mode == "rgb_array":
      return self.render_rgb()
    raise ValueError(f"render mode must be one of {RENDER_MODES}, got {mode!r}")

  @property
  def actions_left(self) -> int:
    return self.config.max_steps - self.num_steps

  def sample_valid_response(self, rng: np.random.Generator) -> str:
    """A well-formed response with a uniformly random action (smoke runs, warm starts)."""
    return f"<answer>{self.ACTIONS[int(rng.integers(len(self.ACTIONS)))]}</answer>"


def grid_to_rgb(grid: Sequence[Sequence[str]], palette: Dict[str, Tuple[tuple, Optional[tuple]]],
                cell_px: int = 24) -> np.ndarray:
  """Draws a symbol grid: each cell filled with its colour, plus an inner marker.

  `palette[symbol] = (background_rgb, marker_rgb or None)`.
  """
  h, w = len(grid), len(grid[0])
  image = np.zeros((h * cell_px, w * cell_px, 3), np.uint8)
  pad = cell_px // 4
  for r, row in enumerate(grid):
    for c, symbol in enumerate(row):
      background, marker = palette[symbol]
      y, x = r * cell_px, c * cell_px
      image[y:y + cell_px, x:x + cell_px] = background
      if marker is not None:
        image[y + pad:y + cell_px - pad, x + pad:x + cell_px - pad] = marker
      image[y, x:x + cell_px] = 40  # grid lines
      image[y:y + cell_px, x] = 40
  return image


def text_to_rgb(text: str, width: int = 640, height: int = 480, columns: int = 100) -> np.ndarray:
  """A page of text on a white image (validation GIFs of text envs: WebShop, tasks)."""
  import textwrap
  from PIL import Image, ImageDraw
  image = Image.new("RGB", (width, height), (255, 255, 255))
  draw = ImageDraw.Draw(image)
  lines = [part for line in text.split("\n") for part in (textwrap.wrap(line, columns) or [""])]
  for i, line in enumerate(lines[:(height - 8) // 13]):
    draw.text((6, 4 + 13 * i), line.encode("latin-1", "replace").decode("latin-1"),
              fill=(20, 20, 20))
  return np.asarray(image)

