"""One real update does something right: the pipeline's own rollout (Ray env workers, a
JetStream server), the learner's update, and its effect on the policy."""

import math
import os

import jax.numpy as jnp
import numpy as np

from rollx import checks, config as config_lib
from tests.conftest import ROOT


def _learn_and_check(learner, batch, samples, adv, returns):
  metrics = {}
  inputs = {"input_ids": jnp.asarray(samples["input_ids"]),
            "segment_ids": jnp.asarray(samples["segment_ids"])}
  before = np.asarray(learner.actor.compute_logprobs(learner.actor_state.params, inputs)[0])
  learner.learn(batch, samples, adv, returns, 0, metrics)
  after = np.asarray(learner.actor.compute_logprobs(learner.actor_state.params, inputs)[0])
  assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith("actor/"))
  # the samples packed (several to a row) and equal ones merged
  assert metrics["packing/rows"] < len(samples["input_ids"])
  assert metrics["packing/distinct_samples"] < 1.0
  response = samples["response_mask"] > 0
  up, down = response & (adv > 0), response & (adv < 0)
  assert up.any() and down.any(), "no group carried a gradient"
  moved = after - before
  # the policy-gradient surrogate rose (first order: sum of A * change of log-prob), and
  # positive-advantage tokens gained against negative ones (the format tokens both
  # share move little either way; the trust region bounds the step)
  assert float((adv * moved)[response].sum()) > 0
  assert moved[up].mean() > moved[down].mean(), (moved[up].mean(), moved[down].mean())
  assert moved[down].mean() < 0


def test_an_update_raises_positive_advantage_tokens_and_lowers_negative_ones(tmp_path):
  from rollx import models
  from rollx.pipeline import AgenticPipeline
  from rollx.trainer.learner import Learner
  c = config_lib.load_file(os.path.join(ROOT, "configs", "frozenlake.py"))
  c.update(rollout_batch_size=16, val_batch_size=4, eval_steps=0, min_informative_groups=1,
           output_dir=str(tmp_path), logging_dir=str(tmp_path / "logs"),
           render_save_dir=str(tmp_path / "render"))
  c.train_env_manager.update(num_env_groups=2, group_size=8)
  c.actor_train.device_mapping = (0,)
  c.actor_train.training_args.update(per_device_train_batch_size=16, warmup_steps=0)
  c.actor_infer.strategy_args.max_concurrent_decodes = 16
  pipeline = AgenticPipeline(checks.validate(c))
  try:
    pipeline.sync_weights()
    collected = pipeline.collect({})
  finally:
    pipeline.close()
  _learn_and_check(pipeline.learner, *collected)
  # the same samples under seq-mean-token-mean, which packs and merges on per-sample
  # token weights (rollx.trainer.packing.per_sample_mean_weights)
  c.loss_agg_mode = "seq-mean-token-mean"
  _learn_and_check(Learner(checks.validate(c), models.load_model(c.pretrain)), *collected)
