"""AgenticPipeline: the agentic RL loop (ROLL's agentic pipeline), one global step at a time.

    1. weight sync learner -> servers (every actor_train.model_update_frequency steps)
    2. validation rollout every eval_steps (greedy, unseen levels), frames saved
    3. train rollout: get_batch(rollout_batch_size) -> whole groups, their rewards from
       the env and a reward model (reward_pretrain, rollx.rewards); with
       drop_zero_advantage_samples the advantages come now (no model needed) and only
       samples with a policy gradient go on; dynamic sampling plays more episodes, up to
       max_rollout_rounds batches, while fewer than min_informative_groups carry one
    4. learner: log-probs (old, reference), values (gae), rollout correction against the
       servers' behaviour log-probs, advantages where not known yet, critic update, actor
       update (PPO epochs over minibatches), KL controller
    5. metrics (TensorBoard + console), transcripts every logging_steps, checkpoint
       every save_steps and at the end; the final policy exported as an HF directory

Roles: the Learner (rollx.trainer.learner) in this process; `num_servers` JetStream
servers, the env workers and the rollout schedulers in Ray actors (rollx.cluster).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Dict, Optional

import jax
import ml_collections
import numpy as np

from rollx import checkpoint, cluster, config as rollx_config, models, stopping
from rollx.algos import advantages as adv_lib, correction
from rollx.errors import RolloutError
from rollx.models import hf, lora
from rollx.rollout.render import save_episode_frames
from rollx.rollout.scheduler import episode_metrics
from rollx.rewards.reward_model import RewardSources
from rollx.rollout.types import RolloutBatch, collate
from rollx.serving.client import RolloutClient
from rollx.tools import sandbox
from rollx.trainer.learner import Learner
from rollx.tracking import Tracker


class AgenticPipeline:

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = c = config
    self._owns_ray = cluster.init_ray(c)
    for warning in rollx_config.inactive_settings(c):
      logging.warning("%s", warning)
    if jax.process_index() == 0:  # the run's first lines: what guards its data
      print(correction.start_line(c), flush=True)
      for line in sandbox.check_entries(c.custom_envs):
        print(line, flush=True)
    policy = models.load_model(c.pretrain)
    self.tokenizer = hf.load_tokenizer(policy.model_dir)
    self.learner = Learner(c, policy)
    self.rewards = RewardSources(c)  # checks.validate matched it to the policy's tokens
    self.step = 0
    self._finished_streams: Optional[Dict[str, dict]] = None  # set as each step starts
    self.servers = cluster.start_servers(c)
    addresses = self.servers.addresses
    self.client = RolloutClient(addresses, weight_targets=[self.servers])
    self.train_rollout = cluster.start_rollout(c, "train_env_manager", addresses, stream="train")
    self.val_rollout = (cluster.start_rollout(c, "val_env_manager", addresses, stream="val",
                                              render_env_ids=range(4))
                        if c.eval_steps > 0 else None)
    self.tracker = Tracker(os.path.join(c.logging_dir, c.exp_name), c.max_steps,
                           enabled=jax.process_index() == 0)
    self.checkpointer = checkpoint.Checkpointer(
        os.path.join(c.output_dir, "checkpoints"), max_to_keep=3)
    resume = checkpoint.resolve_resume(c.resume_from_checkpoint, c.output_dir)
    if resume is not None:
      self._restore(*resume)

  # -- checkpoints ---------------------------------------------------------------------
  def stream_states(self) -> Dict[str, dict]:
    """Where the level streams stand (resume: the next levels, not the same again)."""
    streams = {"train_streams": self.train_rollout.stream_state()}
    if self.val_rollout is not None:
      streams["val_streams"] = self.val_rollout.stream_state()
    return streams

  def save(self, streams: Optional[Dict[str, dict]] = None) -> None:
    """Checkpoint `step` (the steps before it finished); `streams`: the level streams as
    they stood when the last of them finished (default: now)."""
    self.tracker.sync()  # the metrics of every step up to here survive a kill -9 too
    meta = {"step": self.step, "kl_coef": self.learner.kl_ctrl.coef,
            **(streams if streams is not None else self.stream_states())}
    self.checkpointer.save(self.step, self.learner.states(), meta)

  def _save_finished(self) -> Optional[str]:
    """A step was dropped (a stop, a rollout that cannot go on): checkpoint the steps that
    finished, with the streams as they stood after the last (taken before the dropped
    step's rollout moved them), unless saved already. The directory of the last
    checkpoint, if any."""
    latest = self.checkpointer.latest_step()
    if self.step > 0 and latest != self.step:
      self.save(self._finished_streams)
      latest = self.step
    return None if latest is None else os.path.join(self.checkpointer.directory, str(latest))

  def _restore(self, directory: str, step: int) -> None:
    source = self.checkpointer if directory == self.checkpointer.directory else \
        checkpoint.Checkpointer(directory)
    states, meta = source.restore(step, self.learner.abstract_states(checkpoint.abstract_of))
    self.learner.load_states(states)
    self.learner.kl_ctrl.coef = float(meta["kl_coef"])
    self.step = int(meta["step"])
    self.train_rollout.load_stream_state(meta["train_streams"])
    if self.val_rollout is not None and "val_streams" in meta:  # absent in older checkpoints
      self.val_rollout.load_stream_state(meta["val_streams"])
    if self.step % self.config.actor_train.model_update_frequency:
      # train_step syncs only every model_update_frequency steps: the fresh servers
      # would serve the initial weights (version 0) until then, not the restored ones.
      self.sync_weights()
    logging.info("resumed from %s step %d", directory, self.step)

  # -- one step ------------------------------------------------------------------------
  def sync_weights(self) -> Dict[str, float]:
    """Pushes the learner's params (with LoRA: the adapters alone) to every server as
    policy version `step`; the schedulers then drop (async: expire) episodes of versions
    too old to train on. Returns its time and the bytes sent to each server."""
    start = time.time()
    params = self.learner.host_params()
    self.client.update_params(params, self.step)
    for rollout in (self.train_rollout, self.val_rollout):
      if rollout is not None:
        rollout.set_version(self.step)
    return {"time/weight_sync": time.time() - start,
            "weight_sync/bytes": float(lora.nbytes(params))}

  def validate(self) -> Dict[str, float]:
    batch, metrics = self.val_rollout.get_batch(self.config.val_batch_size)
    folder = os.path.join(self.config.render_save_dir, f"step_{self.step:05d}")
    save_episode_frames(batch.trajectories, folder)
    self.tracker.frames(self.step, batch.trajectories)
    return {f"val/{k}": v for k, v in metrics.items() if "/" in k and not k.startswith("rollout")}

  def collect(self, metrics: Dict[str, float]):
    """The step's episodes as a RolloutBatch, its training samples ([N, T] arrays) and,
    when known before the model runs, their advantages and returns (else None)."""
    c = self.config
    t = time.time()
    batch, rollout_metrics = self.train_rollout.get_batch(c.rollout_batch_size)
    metrics["time/rollout"] = time.time() - t
    metrics.update(rollout_metrics)
    self.rewards.new_step()
    batch = self._rewarded(batch, metrics)
    samples = {k: getattr(batch, k) for k in ("input_ids", "segment_ids", "response_mask",
                                              "behaviour_logp", "token_versions")}
    if not c.drop_zero_advantage_samples:
      return batch, samples, None, None
    # Advantages before the model runs (no critic, no KL in the reward: config rules),
    # so samples without a policy gradient skip log-probs and training.
    adv, returns = adv_lib.for_batch(batch, {"response_mask": batch.response_mask}, c)
    has_gradient = np.asarray(adv_lib.informative(adv))
    rounds = 1
    # Dynamic sampling (DAPO, Yu et al. 2025): a step whose informative groups are few
    # would make a noisy update of full size (Adam's step does not shrink with the
    # evidence), so more episodes are played, from the current policy, until enough
    # groups carry a gradient. Advantages are recomputed on the whole: whitening sees
    # every group kept.
    while (rounds < c.max_rollout_rounds and adv_lib.num_informative_groups(
        has_gradient, batch.group_ids) < c.min_informative_groups):
      t = time.time()
      more, _ = self.train_rollout.get_batch(c.rollout_batch_size)
      metrics["time/rollout"] += time.time() - t
      batch = self._rewarded(collate(batch.trajectories + more.trajectories,
                                     c.sequence_length), metrics)
      adv, returns = adv_lib.for_batch(batch, {"response_mask": batch.response_mask}, c)
      has_gradient = np.asarray(adv_lib.informative(adv))
      rounds += 1
    if rounds > 1:
      metrics.update(episode_metrics(batch.trajectories))
    metrics["rollout/rounds"] = float(rounds)
    metrics["rollout/informative_groups"] = float(
        adv_lib.num_informative_groups(has_gradient, batch.group_ids))
    metrics["rollout/kept_samples"] = float(has_gradient.mean())
    keep = adv_lib.samples_to_train(has_gradient)
    samples = {k: getattr(batch, k)[keep] for k in samples}
    return batch, samples, adv[keep], returns[keep]

  def _rewarded(self, batch: RolloutBatch, metrics: Dict[str, float]) -> RolloutBatch:
    """The batch with the rewards it learns from (rollx.rewards: env and reward model)."""
    t = time.time()
    batch, reward_metrics = self.rewards.apply(batch)
    if reward_metrics:
      metrics.update(reward_metrics)
      metrics["time/reward_model"] = metrics.get("time/reward_model", 0.0) + time.time() - t
    return batch

  def train_step(self) -> Dict[str, float]:
    c, t0 = self.config, time.time()
    metrics: Dict[str, float] = {}
    self._finished_streams = self.stream_states()
    if self.step % c.actor_train.model_update_frequency == 0:
      metrics.update(self.sync_weights())
    if self.val_rollout is not None and self.step % c.eval_steps == 0:
      t = time.time()
      metrics.update(self.validate())
      metrics["time/validation"] = time.time() - t
    before = self._served_tokens()
    batch, samples, adv, returns = self.collect(metrics)
    metrics.update(self._prefill_per_turn(before, batch))
    self.learner.learn(batch, samples, adv, returns, self.step, metrics)
    self._summarise(batch, metrics)
    metrics["time/step"] = time.time() - t0
    metrics["tokens_per_s"] = float(batch.segment_ids.sum() / metrics["time/step"])
    if self.step % c.logging_steps == 0:
      self.tracker.transcripts(self.step, batch.trajectories, self.tokenizer)
    return metrics

  def _served_tokens(self):
    """(prompt tokens prefilled, prompt tokens reused from cached KV) over the servers,
    or None when a server does not answer (restarting)."""
    import ray
    try:
      stats = ray.get([a.stats.remote() for a in self.servers.actors], timeout=30)
    except Exception:  # noqa: BLE001 - metrics only; the rollout reports real failures
      return None
    return tuple(sum(s[k] for s in stats) for k in ("prefilled_tokens", "reused_tokens",
                                                      "stale_reused_tokens"))

  def _prefill_per_turn(self, before, batch: RolloutBatch) -> Dict[str, float]:
    """Prompt tokens the servers prefilled (and reused, with `reuse_kv`) per model turn of
    the step's collection: what KV reuse across turns saves. Async collections overlap
    training, so there it is an estimate."""
    after = self._served_tokens()
    turns = sum(t.num_turns for t in batch.trajectories)
    if before is None or after is None or not turns or after[0] < before[0]:
      return {}  # a restarted server counts from zero
    return {"rollout/prefill_tokens_per_turn": (after[0] - before[0]) / turns,
            "rollout/reused_tokens_per_turn": (after[1] - before[1]) / turns,
            # keep_prefix_across_updates: reused ids computed by older weights
            "rollout/stale_reused_tokens_per_turn": (after[2] - before[2]) / turns}

  def _summarise(self, batch: RolloutBatch, metrics: Dict[str, float]) -> None:
    """The headline figures: means over env tags of the per-tag metrics."""
    tags = sorted(set(batch.tags))
    metrics["score"] = float(np.mean([metrics[f"{t}/score_mean"] for t in tags]))
    metrics["success"] = float(np.mean([metrics[f"{t}/success"] for t in tags]))
    val = [v for k, v in metrics.items() if k.startswith("val/") and k.endswith("/success")]
    if val:
      metrics["val_success"] = float(np.mean(val))
    metrics["entropy"] = metrics.get("actor/entropy", float("nan"))
    metrics["loss"] = metrics.get("actor/loss", float("nan"))
    metrics["lr"] = self.learner.lr(self.step)
    metrics["response_length"] = float(batch.response_mask.sum() / max(len(batch), 1))

  def run(self, on_step: Optional[Callable[[int, Dict[str, float]], bool]] = None
          ) -> Dict[str, float]:
    """Trains to max_steps; `on_step(step, metrics)` returning True stops early (benchmarks
    with a wall-clock budget), with the usual final checkpoint and export. SIGINT and
    SIGTERM stop it too (rollx.stopping): the finished steps saved, then `Stopped`."""
    c = self.config
    metrics: Dict[str, float] = {}
    try:
      with stopping.on_signals():
        while self.step < c.max_steps:
          try:
            metrics = self.train_step()
          except (RolloutError, stopping.StopRequested) as e:
            # The step cannot go on (a stop signal; every server down past its restarts,
            # ...): keep what the finished steps learned.
            saved = self._save_finished()
            if isinstance(e, stopping.StopRequested):
              raise stopping.Stopped(stopping.requested(), self.step, saved) from None
            raise
          self.tracker.scalars(self.step, metrics)
          self.tracker.console(self.step, metrics)
          self.step += 1
          stop = on_step is not None and on_step(self.step - 1, metrics)
          signum = stopping.at_step_end(self.step)
          if (self.step % c.save_steps == 0 or self.step == c.max_steps or stop
              or signum is not None):
            self.save()
          if signum is not None:
            raise stopping.Stopped(signum, self.step, os.path.join(
                self.checkpointer.directory, str(self.step)))
          if stop:
            break
        self.export(os.path.join(c.output_dir, "export"))
    finally:
      self.close()
    return metrics

  def export(self, out_dir: str) -> str:
    """The trained policy as a Hugging Face directory (transformers-loadable)."""
    return self.learner.export(out_dir, self.tokenizer,
                               models.resolve_model_dir(self.config.pretrain))

  def close(self) -> None:
    for rollout in (self.train_rollout, self.val_rollout):
      if rollout is not None:
        rollout.stop()
    self.servers.stop()
    self.tracker.close()
    self.checkpointer.close()
    cluster.shutdown_ray(self._owns_ray)
