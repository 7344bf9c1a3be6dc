"""AgenticPipeline: one global step of REFERENCE.md section 1, per step.

    1. weight sync actor_train -> actor_infer servers (every model_update_frequency)
    2. validation rollout every eval_steps (greedy, unseen levels), frames saved
    3. train rollout: scheduler.get_batch(rollout_batch_size) -> whole groups (again,
       up to max_rollout_rounds, while fewer than min_informative_groups carry a gradient)
    4. old log-probs (actor_train), reference log-probs (KL on), values (gae); with
       advantages known, equal samples first merged into one weighted sample each
    5. KL penalty, advantages by adv_estimator (with drop_zero_advantage_samples:
       before 4, and only the samples with a policy gradient go on)
    6. critic update (gae); actor update once step >= critic_warmup: ppo_epochs over
       shuffled minibatches of at most per_device_train_batch_size x
       gradient_accumulation_steps x data shards rows, the step's rows split evenly
       (packed rows of sequence_length tokens: several samples each under token-mean
       aggregation, rollx.trainer.packing)
    7. metrics (TensorBoard + console), transcripts every logging_steps, checkpoint
       every save_steps and at the end; the final policy exported as an HF directory.

Roles: actor_train and critic are Trainers (sharded jit steps) in this process;
actor_infer is `num_servers` JetStream servers in Ray actors; the reference is a
frozen copy of the initial policy, present only when a KL term is on; env workers
and the rollout schedulers are Ray actors.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import ray

from rollx import checkpoint, config as rollx_config, models, serve
from rollx.algos import advantages as adv_lib, kl as kl_lib, losses
from rollx.models import hf, logprobs
from rollx.parallel import distributed, mesh as mesh_lib
from rollx.rollout.env_worker import start_rollout
from rollx.rollout.render import save_episode_frames
from rollx.rollout.scheduler import episode_metrics
from rollx.rollout.types import RolloutBatch, collate
from rollx.serving.client import RolloutClient
from rollx.trainer import packing as packing_lib
from rollx.trainer.step import Trainer
from rollx.tracking import Tracker


def _actor_loss(config, model, params, batch, rng):
  logp, entropy = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"],
                                            batch.get("score_index"))
  mask, agg = batch["response_mask"], config.loss_agg_mode
  low = config.pg_clip_low if config.pg_clip_low is not None else config.pg_clip
  high = config.pg_clip_high if config.pg_clip_high is not None else config.pg_clip
  pg, metrics = losses.ppo_policy_loss(logp, batch["old_logp"], batch["advantages"], mask, low,
                                       high, 3.0 if config.dual_clip_loss else None, agg)
  ent = losses.aggregate(entropy, mask, agg)
  loss = pg - config.entropy_loss_coef * ent
  if config.use_kl_loss:
    kl = losses.aggregate(losses.kl_divergence(logp, batch["ref_logp"], config.kl_loss_type),
                            mask, agg)
    loss = loss + config.kl_loss_coef * kl
    metrics["kl_loss"] = kl
  metrics.update(pg_loss=pg, entropy=ent)
  return loss, metrics


def _actor_update_kl(model, params, batch):
  logp, _ = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"],
                                      batch.get("score_index"))
  return losses.approx_kl(logp, batch["old_logp"], batch["response_mask"])


def actor_trainer(config: ml_collections.ConfigDict, model_config, mesh, total_updates: int
                  ) -> Trainer:
  """The actor_train role's Trainer: the PPO loss and, with `max_update_kl`, the
  per-update trust region (also what bench/step_memory.py compiles)."""
  trust_region = ((_actor_update_kl, config.max_update_kl)
                  if config.max_update_kl is not None else None)
  return Trainer(model_config, config.actor_train, mesh, functools.partial(_actor_loss, config),
                 total_updates, trust_region=trust_region)


def _critic_loss(config, model, params, batch, rng):
  values = logprobs.compute_values(model, params, batch["input_ids"], batch["segment_ids"])
  clip = config.value_clip if config.value_clip > 0 else None
  loss = losses.value_loss(values, batch["old_values"], batch["returns"], batch["response_mask"],
                           clip, config.loss_agg_mode)
  return loss, {"value_loss": loss}


class AgenticPipeline:

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = c = config
    self._owns_ray = not ray.is_initialized()
    if self._owns_ray:
      ray.init(include_dashboard=False, log_to_driver=False, namespace="rollx")
    self.kl_on = c.init_kl_coef > 0 or c.use_kl_loss
    self.use_critic = c.adv_estimator == "gae"
    for warning in rollx_config.inactive_settings(c):
      logging.warning("%s", warning)
    at = c.actor_train
    policy = models.load_model(c.pretrain)
    self.tokenizer = hf.load_tokenizer(policy.model_dir)
    self.model_config = policy.config
    self.mesh = mesh_lib.make_mesh(at.strategy_args, at.device_mapping, "actor_train")
    shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    self.minibatch = (at.training_args.per_device_train_batch_size
                      * at.training_args.gradient_accumulation_steps * shards)
    # Minibatches are equal splits of a step's rows in units of `granule` rows (a quarter
    # minibatch where it divides evenly): little padding, few compiled shapes.
    per_device = at.training_args.per_device_train_batch_size
    self.granule = self.minibatch // 4 if per_device % 4 == 0 else self.minibatch
    updates = c.max_steps * c.ppo_epochs * max(1, c.rollout_batch_size // self.minibatch)
    self.actor = actor_trainer(c, policy.config, self.mesh, updates)
    host_params = jax.device_get(policy.params)  # init_state donates what it is given
    self.actor_state = self.actor.init_state(host_params)
    self.ref_params = (jax.device_put(host_params, self.actor.param_shardings)
                       if self.kl_on else None)
    self.critic = self.critic_state = None
    if self.use_critic:
      cw = c.critic
      critic_mesh = mesh_lib.make_mesh(cw.strategy_args, cw.device_mapping, "critic")
      self.critic = Trainer(policy.config, cw, critic_mesh, functools.partial(_critic_loss, c),
                            updates, head="value", role="critic")
      self.critic_state = self.critic.init_state(hf.critic_params_from_policy(host_params))
    self.kl_ctrl = kl_lib.from_config(c)
    self.rng = jax.random.PRNGKey(c.seed)
    self.step = 0

    # actor_infer: JetStream servers in Ray actors; env workers and schedulers
    self.server_actors, addresses = serve.start_ray_servers(c)
    self.client = RolloutClient(addresses, weight_targets=self.server_actors)
    self.train_rollout = start_rollout(c, "train_env_manager", addresses, stream="train")
    self.val_rollout = (start_rollout(c, "val_env_manager", addresses, stream="val",
                                      render_env_ids=range(4)) if c.eval_steps > 0 else None)
    self.tracker = Tracker(os.path.join(c.logging_dir, c.exp_name), c.max_steps,
                           enabled=jax.process_index() == 0)
    self.checkpointer = checkpoint.Checkpointer(
        os.path.join(c.output_dir, "checkpoints"), max_to_keep=3)
    resume = checkpoint.resolve_resume(c.resume_from_checkpoint, c.output_dir)
    if resume is not None:
      self._restore(*resume)

  # -- checkpoints ---------------------------------------------------------------------
  def _states(self) -> Dict[str, Any]:
    states = {"actor": self.actor_state, "rng": {"key": self.rng}}
    if self.use_critic:
      states["critic"] = self.critic_state
    return states

  def save(self) -> None:
    self.tracker.sync()  # the metrics of every step up to here survive a kill -9 too
    meta = {"step": self.step, "kl_coef": self.kl_ctrl.coef,
            "train_streams": ray.get(self.train_rollout.scheduler.stream_state.remote())}
    if self.val_rollout is not None:  # resume: validation goes on with the next levels
      meta["val_streams"] = ray.get(self.val_rollout.scheduler.stream_state.remote())
    self.checkpointer.save(self.step, self._states(), meta)

  def _restore(self, directory: str, step: int) -> None:
    source = self.checkpointer if directory == self.checkpointer.directory else \
        checkpoint.Checkpointer(directory)
    abstract = {"actor": checkpoint.abstract_of(self.actor_state, self.actor.state_shardings),
                "rng": {"key": jax.ShapeDtypeStruct(self.rng.shape, self.rng.dtype)}}
    if self.use_critic:
      abstract["critic"] = checkpoint.abstract_of(self.critic_state, self.critic.state_shardings)
    states, meta = source.restore(step, abstract)
    self.actor_state, self.rng = states["actor"], states["rng"]["key"]
    if self.use_critic:
      self.critic_state = states["critic"]
    self.kl_ctrl.coef = float(meta["kl_coef"])
    self.step = int(meta["step"])
    ray.get(self.train_rollout.scheduler.load_stream_state.remote(meta["train_streams"]))
    if self.val_rollout is not None and "val_streams" in meta:  # absent in older checkpoints
      ray.get(self.val_rollout.scheduler.load_stream_state.remote(meta["val_streams"]))
    if self.step % self.config.actor_train.model_update_frequency:
      # train_step syncs only every model_update_frequency steps: the fresh servers
      # would serve the initial weights (version 0) until then, not the restored ones.
      self.sync_weights()
    logging.info("resumed from %s step %d", directory, self.step)

  # -- one step ------------------------------------------------------------------------
  def _chunked(self, fn, params, arrays, rows: int) -> np.ndarray:
    """fn over `rows`-row chunks (one compilation per chunk size), concatenated on host."""
    outs = []
    for i in range(0, len(arrays["input_ids"]), rows):
      chunk = {k: jnp.asarray(v[i:i + rows]) for k, v in arrays.items()}
      out = fn(params, chunk)
      outs.append(distributed.to_host(out[0] if isinstance(out, tuple) else out))
    return np.concatenate(outs)

  def sync_weights(self) -> float:
    start = time.time()
    self.client.update_params(distributed.to_host(self.actor_state.params), self.step)
    self.train_rollout.set_version(self.step)
    if self.val_rollout is not None:
      self.val_rollout.set_version(self.step)
    return time.time() - start

  def validate(self) -> Dict[str, float]:
    batch, metrics = self.val_rollout.get_batch(self.config.val_batch_size)
    folder = os.path.join(self.config.render_save_dir, f"step_{self.step:05d}")
    save_episode_frames(batch.trajectories, folder)
    self.tracker.frames(self.step, batch.trajectories)
    return {f"val/{k}": v for k, v in metrics.items() if "/" in k and not k.startswith("rollout")}

  def advantages(self, batch: RolloutBatch, arrays: Dict[str, np.ndarray]):
    c = self.config
    tag_ids = {t: i for i, t in enumerate(sorted(set(batch.tags)))}
    anchor_ids = {a: i for i, a in enumerate(dict.fromkeys(
        (g, a) for g, a in zip(batch.group_ids.tolist(), batch.anchors)))}
    token_kl = np.zeros_like(arrays["response_mask"])
    if c.init_kl_coef > 0 and not c.use_kl_loss:
      token_kl = self.kl_ctrl.coef * (arrays["old_logp"] - arrays["ref_logp"]) * arrays["response_mask"]
    inputs = {
        "response_mask": jnp.asarray(arrays["response_mask"]),
        "scores": jnp.asarray(batch.rewards), "episode_scores": jnp.asarray(batch.episode_scores),
        "group_ids": jnp.asarray(batch.group_ids), "episode_ids": jnp.asarray(batch.episode_ids),
        "step_index": jnp.asarray(batch.step_index),
        "anchor_ids": jnp.asarray([anchor_ids[(g, a)] for g, a in
                                   zip(batch.group_ids.tolist(), batch.anchors)], jnp.int32),
        "tag_ids": jnp.asarray([tag_ids[t] for t in batch.tags], jnp.int32),
        "token_kl": jnp.asarray(token_kl),
        "values": jnp.asarray(arrays.get("old_values", np.zeros_like(token_kl))),
    }
    adv, returns = adv_lib.compute_advantages(inputs, c)
    return np.asarray(adv), np.asarray(returns)

  def _update(self, trainer: Trainer, state, arrays: Dict[str, np.ndarray], keys, rows: int):
    n = len(arrays["input_ids"])
    metrics = []
    for _ in range(self.config.ppo_epochs):
      self.rng, key = jax.random.split(self.rng)
      order = np.asarray(jax.random.permutation(key, n))
      for i in range(0, n, rows):
        mb = trainer.batch_sharding({k: jnp.asarray(arrays[k][order[i:i + rows]]) for k in keys})
        self.rng, key = jax.random.split(self.rng)
        state, m = trainer.update(state, mb, key)
        metrics.append(jax.device_get(m))
    return state, {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]}

  def collect(self, metrics: Dict[str, float]):
    """Step 3 (and 5 with drop_zero_advantage_samples): the step's episodes as a
    RolloutBatch, its training samples ([N, T] arrays) and, when known before the
    model runs, their advantages and returns (else None)."""
    c = self.config
    t = time.time()
    batch, rollout_metrics = self.train_rollout.get_batch(c.rollout_batch_size)
    metrics["time/rollout"] = time.time() - t
    metrics.update(rollout_metrics)
    samples = {k: getattr(batch, k) for k in ("input_ids", "segment_ids", "response_mask")}
    adv = returns = None
    if c.drop_zero_advantage_samples:
      # Advantages before the model runs (no critic, no KL in the reward: config
      # rules), so samples without a policy gradient skip log-probs and training.
      adv, returns = self.advantages(batch, {"response_mask": batch.response_mask})
      has_gradient = np.asarray(adv_lib.informative(adv))
      rounds = 1
      # Dynamic sampling: a step whose informative groups are few would make a noisy
      # update of full size (Adam's step does not shrink with the evidence), so more
      # episodes are played, from the current policy, until enough groups carry a
      # gradient. Advantages are recomputed on the whole: whitening sees every group kept.
      while (rounds < c.max_rollout_rounds and adv_lib.num_informative_groups(
          has_gradient, batch.group_ids) < c.min_informative_groups):
        t = time.time()
        more, _ = self.train_rollout.get_batch(c.rollout_batch_size)
        metrics["time/rollout"] += time.time() - t
        batch = collate(batch.trajectories + more.trajectories, c.sequence_length)
        adv, returns = self.advantages(batch, {"response_mask": batch.response_mask})
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
      adv, returns = adv[keep], returns[keep]
    return batch, samples, adv, returns

  def learn(self, batch: RolloutBatch, samples: Dict[str, np.ndarray],
            adv: Optional[np.ndarray], returns: Optional[np.ndarray],
            metrics: Dict[str, float]) -> None:
    """Steps 4-6 on collected samples: log-probs (and values), advantages where not
    yet known, the critic and actor updates, the KL controller."""
    c = self.config
    min_minibatches = 1
    if adv is not None and c.merge_identical_samples and c.loss_agg_mode == "token-mean":
      # Equal samples run the model once, weighted by their count (exact: see
      # packing.merge_identical). The step keeps the minibatch count the unmerged
      # samples would have had: the same number of optimizer updates, each on a
      # random share of the samples, so only compute changes, not the optimisation.
      lengths = samples["segment_ids"].sum(axis=1)
      unmerged = packing_lib.plan(lengths, c.sequence_length, self.minibatch,
                                  granule=self.granule)
      min_minibatches = unmerged.num_rows // unmerged.minibatch_rows
      samples, adv, returns, merged = packing_lib.merge_samples(samples, adv, returns)
      metrics["packing/distinct_samples"] = float(len(merged.index) / len(lengths))
    # Packed rows for everything that runs the model; the unpacked [N, T] view for
    # the per-sample advantage computation (rollx.trainer.packing).
    packing = packing_lib.plan(samples["segment_ids"].sum(axis=1), c.sequence_length,
                               self.minibatch, pack=c.loss_agg_mode == "token-mean",
                               granule=self.granule, min_minibatches=min_minibatches)
    rows = packing.minibatch_rows
    arrays = {"input_ids": packing.pack(samples["input_ids"]),
              "segment_ids": packing.segment_ids(),
              "response_mask": packing.pack(samples["response_mask"])}
    # the actor's passes (log-probs, loss, trust region) read the response tokens only:
    # the LM head runs there (the critic's value pass is unchanged)
    score_index = packing_lib.score_positions(arrays["response_mask"])
    if score_index is not None:
      arrays["score_index"] = score_index
    # one input structure for the old and reference passes: one compiled program
    inputs = {k: arrays[k] for k in ("input_ids", "segment_ids", "score_index") if k in arrays}
    t = time.time()
    # These passes run a trainer's microbatch of rows at a time (the minibatch over
    # gradient_accumulation_steps): the rows a device was sized for. A whole minibatch
    # of 64 rows x 3072 tokens needed 6.2 GB of XLA temp buffers (default model,
    # configs/sokoban.py:multiturn), a microbatch of 8 rows 0.8 GB.
    actor_rows, critic_rows = (rows // trainer.grad_accum if trainer else rows
                               for trainer in (self.actor, self.critic))
    arrays["old_logp"] = self._chunked(self.actor.compute_logprobs, self.actor_state.params,
                                       inputs, actor_rows)
    if self.kl_on:
      arrays["ref_logp"] = self._chunked(self.actor.compute_logprobs, self.ref_params, inputs,
                                         actor_rows)
    if self.use_critic:
      values_in = {k: arrays[k] for k in ("input_ids", "segment_ids")}
      arrays["old_values"] = self._chunked(self.critic.compute_values, self.critic_state.params,
                                           values_in, critic_rows)
    metrics["time/logprobs"] = time.time() - t
    # the least likely sampled token under the trainer's policy: ~-15 from vocabulary-tail
    # sampling at T=1 (measured from step 0); far below, the server samples off-policy
    response = arrays["response_mask"] > 0
    metrics["rollout/min_token_logp"] = float(arrays["old_logp"][response].min(initial=0.0))
    if adv is None:
      per_sample = {k: packing.unpack(arrays[k]) for k in ("old_logp", "ref_logp", "old_values")
                    if k in arrays}
      per_sample["response_mask"] = batch.response_mask
      adv, returns = self.advantages(batch, per_sample)
    arrays["advantages"], arrays["returns"] = packing.pack(adv), packing.pack(returns)
    metrics["packing/rows"] = float(packing.num_rows)
    metrics["packing/fill"] = float(samples["segment_ids"].sum() / arrays["input_ids"].size)
    t = time.time()
    if self.use_critic:
      self.critic_state, m = self._update(
          self.critic, self.critic_state, arrays,
          ("input_ids", "segment_ids", "response_mask", "old_values", "returns"), rows)
      metrics.update({f"critic/{k}": v for k, v in m.items()})
    if self.step >= c.critic_warmup:
      keys = ("input_ids", "segment_ids", "response_mask", "old_logp", "advantages") + (
          ("ref_logp",) if c.use_kl_loss else ()) + (
          ("score_index",) if score_index is not None else ())
      self.actor_state, m = self._update(self.actor, self.actor_state, arrays, keys, rows)
      metrics.update({f"actor/{k}": v for k, v in m.items()})
    metrics["time/train"] = time.time() - t
    if self.kl_on:
      mask = arrays["response_mask"]
      kl = float(((arrays["old_logp"] - arrays["ref_logp"]) * mask).sum() / max(mask.sum(), 1))
      metrics["kl"] = kl
      # the controller's horizon counts episodes (rollout_batch_size), whether an
      # episode is one trajectory-wise row or one step-wise row per env step
      self.kl_ctrl.update(kl, len(batch.trajectories))
      metrics["kl_coef"] = self.kl_ctrl.coef

  def train_step(self) -> Dict[str, float]:
    c, t0 = self.config, time.time()
    metrics: Dict[str, float] = {}
    if self.step % c.actor_train.model_update_frequency == 0:
      metrics["time/weight_sync"] = self.sync_weights()
    if self.val_rollout is not None and self.step % c.eval_steps == 0:
      t = time.time()
      metrics.update(self.validate())
      metrics["time/validation"] = time.time() - t
    batch, samples, adv, returns = self.collect(metrics)
    self.learn(batch, samples, adv, returns, metrics)
    tags = sorted(set(batch.tags))
    metrics["score"] = float(np.mean([metrics[f"{t}/score_mean"] for t in tags]))
    metrics["success"] = float(np.mean([metrics[f"{t}/success"] for t in tags]))
    if any(k.endswith("/success") and k.startswith("val/") for k in metrics):
      metrics["val_success"] = float(np.mean([v for k, v in metrics.items()
                                              if k.startswith("val/") and k.endswith("/success")]))
    metrics["entropy"] = metrics.get("actor/entropy", float("nan"))
    metrics["loss"] = metrics.get("actor/loss", float("nan"))
    metrics["lr"] = float(self.actor.lr_schedule(int(self.actor_state.step)))
    metrics["response_length"] = float(batch.response_mask.sum() / max(len(batch), 1))
    metrics["time/step"] = time.time() - t0
    metrics["tokens_per_s"] = float(batch.segment_ids.sum() / metrics["time/step"])
    if self.step % c.logging_steps == 0:
      self.tracker.transcripts(self.step, batch.trajectories, self.tokenizer)
    return metrics

  def run(self, on_step: Optional[Callable[[int, Dict[str, float]], bool]] = None
          ) -> Dict[str, float]:
    """Trains to max_steps; `on_step(step, metrics)` returning True stops early (benchmarks
    with a wall-clock budget), with the usual final checkpoint and export."""
    c = self.config
    metrics: Dict[str, float] = {}
    try:
      while self.step < c.max_steps:
        metrics = self.train_step()
        self.tracker.scalars(self.step, metrics)
        self.tracker.console(self.step, metrics)
        self.step += 1
        stop = on_step is not None and on_step(self.step - 1, metrics)
        if self.step % c.save_steps == 0 or self.step == c.max_steps or stop:
          self.save()
        if stop:
          break
      self.export(os.path.join(c.output_dir, "export"))
    finally:
      self.close()
    return metrics

  def export(self, out_dir: str) -> str:
    """The trained policy as a Hugging Face directory (transformers-loadable)."""
    params = distributed.to_host(self.actor_state.params)  # multi-host: every process gathers
    if not distributed.is_coordinator():  # ... and process 0 writes
      return out_dir
    return hf.save_pretrained(params, self.model_config, out_dir,
                              tokenizer=self.tokenizer)

  def close(self) -> None:
    for rollout in (self.train_rollout, self.val_rollout):
      if rollout is not None:
        rollout.stop()
    for actor in self.server_actors:
      ray.kill(actor)
    self.tracker.close()
    self.checkpointer.close()
    if self._owns_ray:  # tear the local cluster down now, not in an atexit race
      ray.shutdown()
