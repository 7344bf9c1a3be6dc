"""Sequence packing: several samples per [sequence_length] row, told apart by segment ids.

A multi-turn batch is mostly short samples (an episode that falls into a hole on
turn 2 is ~150 tokens) padded to the longest allowed one; the train step pays for
every padded position. Packing puts samples side by side in rows of the same
width (first-fit decreasing), numbering them 1, 2, ... within a row; the model's
segment mask keeps attention and positions inside each sample and log-probs never
predict across a boundary (rollx.models.logprobs). Shapes stay static: the row
width is `sequence_length`, and the rows are split into the fewest equal
minibatches of at most `row_multiple` rows, each a multiple of `granule` rows:
padding stays under one granule per minibatch (rounding up to a whole minibatch
wasted up to half the train compute of a step-wise batch), and the jitted
functions see at most row_multiple / granule batch shapes.

Per-sample computations that run over time (GAE, KL-to-go) happen on the
unpacked [N, T] view (`unpack`), the step itself on the packed one (`pack`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class Packing:
  row: np.ndarray  # [N] packed row of each sample
  offset: np.ndarray  # [N] its first position in that row
  length: np.ndarray  # [N] its number of tokens
  segment: np.ndarray  # [N] its segment id in the row (1-based)
  num_rows: int
  width: int
  minibatch_rows: int  # rows per minibatch; num_rows is a multiple of it

  @functools.cached_property  # a step packs/unpacks ~8 arrays with the same plan
  def _index(self):
    """(sample, t) -> (row, offset + t) for every real token, as flat index arrays."""
    sample = np.repeat(np.arange(len(self.length)), self.length)
    starts = np.cumsum(self.length) - self.length
    t = np.arange(len(sample)) - np.repeat(starts, self.length)
    return sample, t, self.row[sample], self.offset[sample] + t

  def pack(self, x_nt: np.ndarray) -> np.ndarray:
    """[N, T, ...] sample-aligned -> [num_rows, width, ...] packed (zeros elsewhere)."""
    sample, t, row, col = self._index
    out = np.zeros((self.num_rows, self.width) + x_nt.shape[2:], x_nt.dtype)
    out[row, col] = x_nt[sample, t]
    return out

  def unpack(self, y_rt: np.ndarray) -> np.ndarray:
    """[num_rows, width, ...] packed -> [N, width, ...] with each sample at position 0."""
    sample, t, row, col = self._index
    out = np.zeros((len(self.length), self.width) + y_rt.shape[2:], y_rt.dtype)
    out[sample, t] = y_rt[row, col]
    return out

  def segment_ids(self) -> np.ndarray:
    sample, _, row, col = self._index
    out = np.zeros((self.num_rows, self.width), np.int32)
    out[row, col] = self.segment[sample]
    return out


def split_rows(rows: int, minibatch: int, granule: int, min_minibatches: int = 1
               ) -> tuple[int, int]:
  """(padded row count, rows per minibatch) for the fewest minibatches (at least
  `min_minibatches`) of at most `minibatch` rows, all of one size, a multiple of
  `granule` (which divides `minibatch`)."""
  if minibatch % granule:
    raise ValueError(f"granule {granule} does not divide the minibatch of {minibatch} rows")
  n = max(1, min_minibatches, math.ceil(rows / minibatch))
  size = max(1, math.ceil(rows / n / granule)) * granule
  return n * size, size


def plan(lengths, width: int, row_multiple: int = 1, pack: bool = True,
         granule: int | None = None, min_minibatches: int = 1) -> Packing:
  """First-fit decreasing into rows of `width`; `pack=False`: one sample per row.

  Rows are padded for minibatches of at most `row_multiple` rows made of `granule`-row
  units (default: whole minibatches, i.e. a multiple of `row_multiple`), at least
  `min_minibatches` of them."""
  lengths = np.asarray(lengths, np.int64)
  if len(lengths) and lengths.max() > width:
    raise ValueError(f"a sample of {lengths.max()} tokens exceeds sequence_length={width}")
  n = len(lengths)
  row, offset, segment = np.zeros(n, np.int64), np.zeros(n, np.int64), np.ones(n, np.int64)
  if pack:
    used, count = [], []  # per open row: tokens used, samples in it
    for i in np.argsort(-lengths, kind="stable"):
      k = next((r for r, u in enumerate(used) if u + lengths[i] <= width), len(used))
      if k == len(used):
        used.append(0)
        count.append(0)
      row[i], offset[i] = k, used[k]
      used[k] += lengths[i]
      count[k] += 1
      segment[i] = count[k]
    rows = len(used)
  else:
    row, rows = np.arange(n), n
  num_rows, minibatch_rows = split_rows(rows, row_multiple, granule or row_multiple,
                                        min_minibatches)
  return Packing(row, offset, lengths, segment, num_rows, width, minibatch_rows)


@dataclasses.dataclass(frozen=True)
class Merged:
  index: np.ndarray  # [M] the sample that stands for each merged one (its first copy)
  weight: np.ndarray  # [M] how many samples it stands for
  advantages: np.ndarray  # [M, T] their mean advantage, token by token


def merge_identical(input_ids_nt: np.ndarray, lengths_n: np.ndarray,
                    response_mask_nt: np.ndarray, adv_nt: np.ndarray,
                    also_equal_nt: Optional[np.ndarray] = None) -> Merged:
  """One sample per distinct (tokens, response mask, sign of each token's advantage,
  and `also_equal_nt`'s row when given: e.g. the behaviour log-probs, whose importance
  weights scale each copy's loss, so only copies with equal weights may merge).

  Step-wise samples repeat: the 8 episodes of a group start on one map, so their first
  prompts are equal, and once the policy is fairly sure most of a group walks the same
  path. Equal samples have equal log-probs, entropy and KL under any params, so the
  actor's loss over them is the loss of one copy with the response mask scaled by the
  count and the mean advantage: exactly, including PPO's clip and the dual clip, as
  long as the copies' advantages share their sign on every token (for a fixed sign the
  clipped objective is linear in A). The log-prob, reference and train passes then run
  once per distinct sample. Only under token-weighted aggregation (the weight is a token
  weight; per-row means would count a merged row once): token-mean, and
  seq-mean-token-mean through `per_sample_mean_weights`.
  """
  n = len(lengths_n)
  lengths_n = np.asarray(lengths_n, np.int64)
  sign_nt = np.sign(adv_nt * (response_mask_nt > 0)).astype(np.int8)
  key_of = {}
  first = []  # the first copy of each distinct sample, in order of appearance
  group_n = np.empty(n, np.int64)
  for i in range(n):
    k = lengths_n[i]
    key = (input_ids_nt[i, :k].tobytes(), (response_mask_nt[i, :k] > 0).tobytes(),
           sign_nt[i, :k].tobytes(),
           b"" if also_equal_nt is None else also_equal_nt[i, :k].tobytes())
    group_n[i] = key_of.setdefault(key, len(key_of))
    if group_n[i] == len(first):
      first.append(i)
  m = len(first)
  index = np.asarray(first, np.int64)
  weight = np.bincount(group_n, minlength=m)
  adv_sum = np.zeros((m,) + adv_nt.shape[1:], np.float64)
  np.add.at(adv_sum, group_n, adv_nt)
  return Merged(index, weight, (adv_sum / weight[:, None]).astype(adv_nt.dtype))


def per_sample_mean_weights(response_mask_nt: np.ndarray) -> np.ndarray:
  """The response mask with each sample's tokens weighing 1 / its response-token count.
  A token mean under these weights is the mean over samples of each one's token mean
  (seq-mean-token-mean), exactly, however the samples are packed into rows or merged
  (a merged copy's count scales its weights): so that mode packs as token-mean does."""
  mask = np.asarray(response_mask_nt, np.float32)
  return mask / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)


def merge_samples(samples: dict, adv_nt: np.ndarray, returns_nt: np.ndarray,
                  also_equal: Optional[str] = None):
  """`merge_identical` applied to a step's [N, T] training samples (input_ids,
  segment_ids, response_mask, ...; `also_equal` names one more that copies must share):
  (samples with each merged one's response mask scaled by its count, their advantages,
  their returns, the Merged record)."""
  lengths = samples["segment_ids"].sum(axis=1)
  merged = merge_identical(samples["input_ids"], lengths, samples["response_mask"], adv_nt,
                           None if also_equal is None else samples[also_equal])
  out = {k: v[merged.index] for k, v in samples.items()}
  out["response_mask"] = out["response_mask"] * merged.weight[:, None]
  return out, merged.advantages, returns_nt[merged.index], merged


def score_positions(response_mask_rt: np.ndarray, min_k: int = 8, max_k: int | None = None):
  """[rows, K] positions of each row's response tokens, padded with the row width (K a
  power of two >= the most any row has, so a run sees few shapes); None when K would
  exceed `max_k` (default half the width: gathering would save little), then score
  everything. For rollx.models.logprobs.compute_logprobs(score_bk=...)."""
  rows, width = response_mask_rt.shape
  max_k = width // 2 if max_k is None else max_k
  row, col = np.nonzero(response_mask_rt > 0)
  counts = np.bincount(row, minlength=rows)
  k = max(min_k, 1 << int(max(counts.max(initial=0), 1) - 1).bit_length())
  if k > max_k:
    return None
  out = np.full((rows, k), width, np.int32)
  rank = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
  out[row, rank] = col
  return out
