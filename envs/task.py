"""Verifiable tasks as a text env: a problem, then an answer the task's own scorer checks.

Problems come from `reasoning-gym` (procedural, offline, one scorer per task family):
`datasets` names the families (with `dataset_params`, each family's generator options);
a level seed picks the family and the problem, reproducibly. Training and validation
draw from disjoint generator seeds (`split`). The answer is the text inside the env's
`action_pattern` (`<answer>...</answer>`); its reward is the family's score in [0, 1]
(`dataset.score_answer`), success a score of 1. A response with no answer is an invalid
action (format penalty) and the episode goes on, up to `max_steps`.

Tool-using agents (`agent_loop = "tool"`) call tools between answers; the env sees only
their final answers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import string
from typing import Any, Dict, Optional, Tuple

import numpy as np

from envs import base, parsing
from envs.registry import register_env

_SPLIT_SEEDS = {"train": 0, "validation": 1_000_003}
DATASET_SIZE = 1_000_000  # problems per family and split; a seed picks one
MAX_ANSWER_CHARS = 2000


@dataclasses.dataclass
class TaskConfig(base.TextEnvConfig):
  max_steps: int = 1  # answers per episode (tool calls do not count)
  format_penalty: float = 0.0  # a response with no <answer>
  datasets: Tuple[str, ...] = ("basic_arithmetic",)  # reasoning-gym task families
  # family -> its generator options, as JSON text (config-friendly), e.g.
  # '{"basic_arithmetic": {"min_terms": 3, "max_terms": 4, "min_digits": 3, "max_digits": 4}}'
  dataset_params: str = "{}"
  split: str = "train"  # train | validation: disjoint generator seeds


@functools.lru_cache(maxsize=64)
def _dataset(name: str, params_json: str, split: str):
  import reasoning_gym
  params = json.loads(params_json)
  return reasoning_gym.create_dataset(name, seed=_SPLIT_SEEDS[split], size=DATASET_SIZE,
                                      **params)


@register_env("ReasoningTask")
class ReasoningTask(base.TextEnv):
  Config = TaskConfig
  MAX_OBSERVATION_CHARS = 65536

  def __init__(self, config: Optional[TaskConfig] = None, render_mode=None):
    super().__init__(config, render_mode)
    self.entry: Dict[str, Any] = {}
    self.family = ""
    self.answer: Optional[str] = None
    self.score = 0.0

  def check_config(self) -> None:
    cfg = self.config
    if cfg.split not in _SPLIT_SEEDS:
      raise ValueError(f"ReasoningTask split must be train or validation, got {cfg.split!r}")
    if not cfg.datasets:
      raise ValueError("ReasoningTask datasets must name at least one reasoning-gym family")
    try:
      params = json.loads(cfg.dataset_params)
    except ValueError as e:
      raise ValueError(f"ReasoningTask dataset_params is not JSON: {e}") from None
    if not isinstance(params, dict) or set(params) - set(cfg.datasets):
      raise ValueError("ReasoningTask dataset_params must map families of `datasets` to "
                       f"their options, got {cfg.dataset_params}")
    import reasoning_gym
    for name in cfg.datasets:
      try:
        reasoning_gym.create_dataset(name, seed=0, size=1, **params.get(name, {}))
      except Exception as e:  # an unknown family or a bad option: name it
        raise ValueError(f"ReasoningTask dataset {name!r}: {type(e).__name__}: {e}") from None

  def observation_charset(self) -> str:
    return string.printable

  def _dataset_of(self, name: str):
    params = json.loads(self.config.dataset_params).get(name, {})
    return _dataset(name, json.dumps(params, sort_keys=True), self.config.split)

  def _new_episode(self, seed: int) -> None:
    rng = np.random.default_rng(seed)
    self.family = self.config.datasets[int(rng.integers(len(self.config.datasets)))]
    dataset = self._dataset_of(self.family)
    self.entry = dataset[int(rng.integers(DATASET_SIZE))]
    self.answer, self.score = None, 0.0

  @property
  def question(self) -> str:
    return self.entry["question"]

  def parse(self, action_text) -> Optional[str]:
    answer = parsing.extract_answer(action_text, self.config.action_pattern)
    return answer if answer and len(answer) <= MAX_ANSWER_CHARS else None

  def _apply(self, action: str) -> Tuple[float, bool, bool]:
    self.answer = action
    try:
      score = float(self._dataset_of(self.family).score_answer(action, self.entry))
    except Exception:  # a scorer that chokes on a strange answer: that answer is wrong
      score = 0.0
    self.score = score
    return score, True, score >= 1.0

  def render_text(self) -> str:
    if self.answer is None:
      return self.question
    return f"{self.question}\nAnswer: {self.answer} (score {self.score:g})"

  def render_rgb(self) -> np.ndarray:
    return base.text_to_rgb(self.render_text())

  @property
  def instructions(self) -> str:
    return "Solve the problem. Give the final answer as <answer>...</answer>."

  def sample_valid_response(self, rng: np.random.Generator) -> str:
    """A well-formed answer that ignores the problem: a random small integer."""
    return f"<answer>{int(rng.integers(-100, 1000))}</answer>"
