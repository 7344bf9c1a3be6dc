"""What the rollout produces: trajectories / step samples, and the padded batch the
trainer consumes. Defined once, used from the env managers to the train step."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np


@dataclasses.dataclass
class Ticket:
  """One episode to run: which env, which level (seed), which group generation."""
  env_id: int
  tag: str
  group_id: int
  generation: int  # the group's n-th episode; all envs of a group share its seed
  seed: int
  ticket_id: int = 0


@dataclasses.dataclass
class Sample:
  """One training sequence: a whole trajectory (StarPO) or one env step (GiGPO)."""
  input_ids: List[int]
  response_mask: List[int]  # 1 exactly on model-generated ids
  token_versions: List[int]  # policy version per input id (-1 on prompt/template ids)
  reward: float  # trajectory: episode score; step-wise: this step's env reward
  step_index: int = 0  # step-wise: index of the env step in its episode
  anchor: str = ""  # step-wise: hash of the observation acted on (GiGPO anchor state)
  # per input id: the log-prob the server sampled it with (rollx.serving.slot_ops.sample_tokens);
  # NaN on prompt/template ids and where unknown (None: unknown everywhere)
  behaviour_logp: Optional[List[float]] = None


def oldest_response_version(samples: Sequence["Sample"]) -> int:
  """The oldest policy version among the samples' generated ids (-1: none known): a
  trajectory's `start_version`."""
  return min((v for s in samples for v, m in zip(s.token_versions, s.response_mask)
              if m and v >= 0), default=-1)


@dataclasses.dataclass
class Trajectory:
  ticket: Ticket
  samples: List[Sample]  # one (trajectory-wise) or one per env step (step-wise)
  score: float  # sum of env rewards
  success: bool
  num_turns: int
  num_invalid_actions: int
  finish: str  # terminated | truncated (the env's move limit) | length (out of tokens)
  start_version: int  # oldest policy version used by any response
  num_ineffective_actions: int = 0  # valid actions that left the observation unchanged
  transcript: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  frames: List[np.ndarray] = dataclasses.field(default_factory=list)
  # step-wise training only: board symmetry -> the episode's samples seen through it
  # (rollx.rollout.env_manager); each is one more episode of the group in the batch
  views: Dict[str, List[Sample]] = dataclasses.field(default_factory=dict)
  # tool loop: tool calls and their errors by kind (rollx.tools.ERROR_KINDS)
  tool_counts: Dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def num_response_tokens(self) -> int:
    return sum(sum(s.response_mask) for s in self.samples)


@dataclasses.dataclass
class RolloutBatch:
  """Padded arrays, one row per sample. Rows of one group are contiguous."""
  input_ids: np.ndarray  # [N, T] int32 (pad 0)
  segment_ids: np.ndarray  # [N, T] int32: 1 on tokens, 0 on padding
  response_mask: np.ndarray  # [N, T] float32
  token_versions: np.ndarray  # [N, T] int32
  behaviour_logp: np.ndarray  # [N, T] float32, NaN where unknown (see Sample)
  rewards: np.ndarray  # [N] float32 (episode score, or step reward for step-wise)
  episode_scores: np.ndarray  # [N] float32
  group_ids: np.ndarray  # [N] int32: one id per (group, generation)
  episode_ids: np.ndarray  # [N] int32: one id per trajectory
  step_index: np.ndarray  # [N] int32
  anchors: List[str]  # [N]
  tags: List[str]  # [N]
  policy_versions: np.ndarray  # [N] int32: oldest version in the row's responses
  trajectories: List[Trajectory] = dataclasses.field(default_factory=list, repr=False)

  def __len__(self) -> int:
    return len(self.input_ids)

  def arrays(self) -> Dict[str, np.ndarray]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)}


def collate(trajectories: Sequence[Trajectory], sequence_length: int,
            group_key=lambda t: (t.ticket.tag, t.ticket.group_id, t.ticket.generation)
            ) -> RolloutBatch:
  """Stacks trajectories' samples into right-padded [N, sequence_length] arrays.

  A trajectory's symmetric views (`Trajectory.views`) follow its own samples as
  further episodes of its group, with its episode score: a group's score mean and
  spread, and so its advantages, are those of its played episodes.
  """
  episode_rows = [(t, samples) for t in trajectories
                  for samples in (t.samples, *t.views.values())]
  rows = [(t, s) for t, samples in episode_rows for s in samples]
  episode_of_row = [e for e, (_, samples) in enumerate(episode_rows) for _ in samples]
  n, width = len(rows), sequence_length
  ids = np.zeros((n, width), np.int32)
  seg = np.zeros((n, width), np.int32)
  mask = np.zeros((n, width), np.float32)
  vers = np.full((n, width), -1, np.int32)
  behaviour = np.full((n, width), np.nan, np.float32)
  groups: Dict[Any, int] = {}
  episodes: Dict[int, int] = {}  # numbered in order of first row
  for i, (t, s) in enumerate(rows):
    if len(s.input_ids) > width:
      raise ValueError(f"a sample of {len(s.input_ids)} tokens exceeds sequence_length={width}")
    k = len(s.input_ids)
    ids[i, :k], seg[i, :k] = s.input_ids, 1
    mask[i, :k], vers[i, :k] = s.response_mask, s.token_versions
    if s.behaviour_logp is not None:
      behaviour[i, :k] = s.behaviour_logp
    groups.setdefault(group_key(t), len(groups))
    episodes.setdefault(episode_of_row[i], len(episodes))
  responses = lambda s: [v for v, m in zip(s.token_versions, s.response_mask) if m]
  return RolloutBatch(
      input_ids=ids, segment_ids=seg, response_mask=mask, token_versions=vers,
      behaviour_logp=behaviour,
      rewards=np.array([s.reward for _, s in rows], np.float32),
      episode_scores=np.array([t.score for t, _ in rows], np.float32),
      group_ids=np.array([groups[group_key(t)] for t, _ in rows], np.int32),
      episode_ids=np.array([episodes[e] for e in episode_of_row], np.int32),
      step_index=np.array([s.step_index for _, s in rows], np.int32),
      anchors=[s.anchor for _, s in rows], tags=[t.ticket.tag for t, _ in rows],
      policy_versions=np.array([min(responses(s), default=-1) for _, s in rows], np.int32),
      trajectories=list(trajectories))
