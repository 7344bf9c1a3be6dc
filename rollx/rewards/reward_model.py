"""A scalar reward model: a sequence-classification checkpoint scoring token sequences.

The checkpoint is what transformers' `AutoModelForSequenceClassification` writes for a
Qwen2 or Llama backbone (the causal LM's trunk, a bias-free `score` head). A sequence's
score is the head's output at its last token, as transformers takes it at the last
non-padding token; here lengths are explicit, so a pad id inside a sequence is a token.
Sequences are scored in batches, each right-padded to a power-of-two length (one
compiled program per bucket and batch size).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rollx import models
from rollx.algos.advantages import bucket
from rollx.models import llm

MIN_BUCKET = 16


@functools.partial(jax.jit, static_argnames="model")
def _last_token_scores(params, tokens_bt, lengths_b, *, model):
  segment_ids = (jnp.arange(tokens_bt.shape[1])[None] < lengths_b[:, None]).astype(jnp.int32)
  out = llm.forward(model, params, tokens_bt, segment_ids,
                    gather_bk=(lengths_b - 1)[:, None])  # [B, 1, num_labels]
  return out[:, 0]


class RewardModel:
  """`score(sequences) -> [N]` (one label) or `[N, num_labels]`, float32."""

  def __init__(self, pretrain: str, dtype: str = "fp32", batch_size: int = 8,
               max_length: Optional[int] = None):
    loaded = models.load_model(pretrain, dtype=dtype, head="score")
    self.model, self.params, self.config = loaded.model, loaded.params, loaded.config
    self.batch_size = batch_size
    self.max_length = max_length or self.config.max_position_embeddings

  def score(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
    for i, seq in enumerate(sequences):
      if not 0 < len(seq) <= self.max_length:
        raise ValueError(f"reward model: sequence {i} has {len(seq)} tokens; scored "
                         f"sequences have 1 to {self.max_length}")
    scores = np.zeros((len(sequences), self.config.num_labels), np.float32)
    # longest first, so that a batch's rows share a bucket as far as they can
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      width = bucket(len(sequences[rows[0]]), MIN_BUCKET)
      tokens = np.zeros((self.batch_size, width), np.int32)
      lengths = np.ones((self.batch_size,), np.int32)  # filler rows: one pad token
      for r, i in enumerate(rows):
        tokens[r, :len(sequences[i])] = sequences[i]
        lengths[r] = len(sequences[i])
      out = _last_token_scores(self.params, jnp.asarray(tokens), jnp.asarray(lengths),
                               model=self.model)
      scores[rows] = np.asarray(out)[:len(rows)]
    return scores[:, 0] if self.config.num_labels == 1 else scores


class RewardSources:
  """The rewards a training batch learns from: the env's and the reward model's, each
  weighted (`reward_sources`); the episodes' own scores and success stay the env's.

  The reward model scores each row's tokens (trajectory-wise rows: the whole
  conversation). Rows are re-collated when dynamic sampling adds episodes, so scores are
  kept by content for the step (`new_step`) and nothing is scored twice.
  """

  def __init__(self, config, reward_model: Optional[RewardModel] = None):
    self.env_weight = float(config.reward_sources.env)
    self.model_weight = float(config.reward_sources.reward_model)
    self.reward_model = reward_model
    if reward_model is None and config.reward_pretrain:
      self.reward_model = RewardModel(config.reward_pretrain,
                                      batch_size=config.reward_batch_size)
    self._scores: dict = {}

  def new_step(self) -> None:
    self._scores = {}

  def apply(self, batch):
    """(batch with its rewards replaced, metrics); the batch as is without a model."""
    if self.reward_model is None:
      return batch, {}
    rows = [row[:int(n)] for row, n in zip(batch.input_ids, batch.segment_ids.sum(1))]
    todo = [r for r in rows if r.tobytes() not in self._scores]
    for r, s in zip(todo, self.reward_model.score(todo) if todo else []):
      self._scores[r.tobytes()] = float(s)
    model = np.array([self._scores[r.tobytes()] for r in rows], np.float32)
    rewards = (self.env_weight * batch.rewards + self.model_weight * model).astype(np.float32)
    metrics = {"reward/env": float(batch.rewards.mean()),
               "reward/reward_model": float(model.mean())}
    for tag in sorted(set(batch.tags)):
      rows_of_tag = np.array([t == tag for t in batch.tags])
      metrics[f"reward/reward_model/{tag}"] = float(model[rows_of_tag].mean())
    return dataclasses.replace(batch, rewards=rewards, episode_scores=rewards), metrics
