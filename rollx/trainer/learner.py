"""The learner: actor_train, critic and reference in this process, from samples to updates.

    learner = Learner(config, policy)               # policy: rollx.models.LoadedModel
    learner.learn(batch, samples, adv, returns, step, metrics)
    params = learner.host_params()                   # what weight sync pushes to the servers

`learn` runs, on a step's training samples: sequence packing (and merging of equal
samples), the old / reference log-prob passes and the critic's values, the rollout
correction's importance weights against the servers' behaviour log-probs, the advantages
where they were not known before the model ran, the critic update (gae) and the actor's
PPO epochs, and the adaptive KL controller. Roles: actor_train and critic are Trainers
(sharded jit steps) on meshes from their strategy_args; the reference is a frozen copy
of the initial policy on its own mesh, present only when a KL term is on.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rollx import models
from rollx.algos import advantages as adv_lib, correction, kl as kl_lib, losses
from rollx.models import hf, lora as lora_lib
from rollx.parallel import distributed, mesh as mesh_lib
from rollx.rollout.types import RolloutBatch
from rollx.trainer import packing as packing_lib
from rollx.trainer.step import Trainer

# The reference reuses actor_train's compiled log-prob pass when it is set up alike.
_SAME_SETUP_KEYS = ("model_args.dtype", "model_args.attention_block", "strategy_args.dp_size",
                    "strategy_args.fsdp_size", "strategy_args.tp_size", "strategy_args.pp_size",
                    "strategy_args.num_microbatches", "device_mapping")


def _get(block, dotted: str):
  for part in dotted.split("."):
    block = block[part]
  return block


def loss_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config the roles' losses are bound to: `config`, except that seq-mean-token-mean
  reads token-mean, because `Learner.learn` hands the losses packed rows whose response
  masks carry the per-sample weights (losses.TOKEN_WEIGHTED_MODES)."""
  if config.loss_agg_mode != "seq-mean-token-mean":
    return config
  out = config.copy_and_resolve_references()
  out.loss_agg_mode = "token-mean"
  return out


def actor_trainer(config: ml_collections.ConfigDict, model_config, mesh, total_updates: int
                  ) -> Trainer:
  """The actor_train role's Trainer: the PPO loss and, with `max_update_kl`, the
  per-update trust region (also what bench/step_memory.py compiles), on packed rows as
  `Learner.learn` makes them (loss_config)."""
  config = loss_config(config)
  trust_region = ((functools.partial(losses.update_kl, config), config.max_update_kl)
                  if config.max_update_kl is not None else None)
  return Trainer(model_config, config.actor_train, mesh, functools.partial(losses.actor_loss, config),
                 total_updates, trust_region=trust_region,
                 weight_fn=functools.partial(losses.loss_weight, config.loss_agg_mode),
                 temperature=correction.sampling_temperature(config))


class Learner:

  def __init__(self, config: ml_collections.ConfigDict, policy: models.LoadedModel):
    self.config = c = config
    self.kl_on = c.init_kl_coef > 0 or c.use_kl_loss
    self.use_critic = c.adv_estimator == "gae"
    self.model_config = policy.config
    at = c.actor_train
    self.mesh = mesh_lib.make_mesh(at.strategy_args, at.device_mapping, "actor_train")
    shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    self.minibatch = (at.training_args.per_device_train_batch_size
                      * at.training_args.gradient_accumulation_steps * shards)
    # Minibatches are equal splits of a step's rows in units of `granule` rows (a quarter
    # minibatch where it divides evenly): little padding, few compiled shapes.
    per_device = at.training_args.per_device_train_batch_size
    self.granule = self.minibatch // 4 if per_device % 4 == 0 else self.minibatch
    # The learning-rate schedules run over global steps: a step makes as many updates as
    # its samples fill minibatches (and dynamic sampling adds rounds), so a horizon
    # counted in updates would end before the run does.
    self.actor = actor_trainer(c, policy.config, self.mesh, c.max_steps)
    host_params = jax.device_get(policy.params)  # init_state donates what it is given
    start = lora_lib.check_adapter_dir(at.model_args.lora, policy.config)
    if start is not None:  # training goes on from these adapters (the base: pretrain)
      host_params = lora_lib.combine(host_params, start)
    self.actor_state = self.actor.init_state(
        host_params, jax.random.fold_in(jax.random.PRNGKey(c.seed), 1))
    self.lora = self.actor.lora
    self.reference = self.ref_params = None
    if self.kl_on:
      ref = c.reference
      if all(_get(ref, k) == _get(at, k) for k in _SAME_SETUP_KEYS):
        self.reference = self.actor  # one compiled program for the old and reference passes
      else:
        ref_mesh = mesh_lib.make_mesh(ref.strategy_args, ref.device_mapping, "reference")
        self.reference = Trainer(policy.config, ref, ref_mesh, loss_fn=None, total_steps=1,
                                 role="reference",
                                 temperature=correction.sampling_temperature(c))
      if not (self.lora and self.reference is self.actor):  # else: the base (reference_params)
        self.ref_params = jax.device_put(lora_lib.split(host_params)[0],
                                         self.reference.param_shardings)
    self.critic = self.critic_state = None
    if self.use_critic:
      cw = c.critic
      critic_mesh = mesh_lib.make_mesh(cw.strategy_args, cw.device_mapping, "critic")
      lc = loss_config(c)
      self.critic = Trainer(policy.config, cw, critic_mesh,
                            functools.partial(losses.critic_loss, lc), c.max_steps, head="value",
                            role="critic",
                            weight_fn=functools.partial(losses.loss_weight, lc.loss_agg_mode))
      self.critic_state = self.critic.init_state(
          hf.critic_params_from_policy(lora_lib.split(host_params)[0]))
    self.kl_ctrl = kl_lib.from_config(c)
    self.rng = jax.random.PRNGKey(c.seed)
    self.correction = correction.resolve(c)

  # -- weights and checkpoints -----------------------------------------------------------
  def host_params(self):
    """What a weight sync sends the servers, on host (multi-host: every process gathers):
    the policy's params, or with adapters the adapters alone (`lora.AdapterWeights`:
    the servers fold them into the base they loaded)."""
    if self.lora:
      return lora_lib.AdapterWeights(distributed.to_host(self.actor_state.params),
                                     self.lora.scale)
    return distributed.to_host(self.actor_state.params)

  def policy_params(self):
    """The policy's whole params on host, adapters folded into the base."""
    if self.lora:
      return lora_lib.merge(distributed.to_host(self.actor_state.frozen),
                            distributed.to_host(self.actor_state.params), self.lora.scale)
    return distributed.to_host(self.actor_state.params)

  def reference_params(self):
    """The KL reference's params: with adapters, the actor's frozen base itself."""
    return self.actor_state.frozen if self.ref_params is None else self.ref_params

  def lr(self, step: int) -> float:
    """The actor's learning rate at global step `step`."""
    return float(self.actor.lr_schedule(step))

  def states(self) -> Dict[str, Any]:
    states = {"actor": self.actor_state, "rng": {"key": self.rng}}
    if self.use_critic:
      states["critic"] = self.critic_state
    return states

  def abstract_states(self, abstract_of) -> Dict[str, Any]:
    """`states()`'s shapes and shardings, for a restore (`abstract_of(state, shardings)`)."""
    abstract = {"actor": abstract_of(self.actor_state, self.actor.state_shardings),
                "rng": {"key": jax.ShapeDtypeStruct(self.rng.shape, self.rng.dtype)}}
    if self.use_critic:
      abstract["critic"] = abstract_of(self.critic_state, self.critic.state_shardings)
    return abstract

  def load_states(self, states: Dict[str, Any]) -> None:
    self.actor_state, self.rng = states["actor"], states["rng"]["key"]
    if self.use_critic:
      self.critic_state = states["critic"]

  def export(self, out_dir: str, tokenizer, base_model: str = "") -> str:
    """The trained policy as a Hugging Face directory (transformers-loadable); with LoRA
    the adapters folded in, and the adapters alone as a PEFT directory in
    `out_dir/adapter` (for `peft` onto the base `base_model`)."""
    params = self.policy_params()
    adapters = distributed.to_host(self.actor_state.params) if self.lora else None
    if not distributed.is_coordinator():  # ... and process 0 writes
      return out_dir
    if adapters is not None:
      lora_lib.save_peft(adapters, self.lora, self.model_config,
                         os.path.join(out_dir, "adapter"), base_model)
    return hf.save_pretrained(params, self.model_config, out_dir, tokenizer=tokenizer)

  # -- one step's learning ---------------------------------------------------------------
  def _chunked(self, fn, params, arrays, rows: int) -> np.ndarray:
    """fn over `rows`-row chunks (one compilation per chunk size), concatenated on host."""
    outs = []
    for i in range(0, len(arrays["input_ids"]), rows):
      chunk = {k: jnp.asarray(v[i:i + rows]) for k, v in arrays.items()}
      out = fn(params, chunk)
      outs.append(distributed.to_host(out[0] if isinstance(out, tuple) else out))
    return np.concatenate(outs)

  def _update(self, trainer: Trainer, state, arrays: Dict[str, np.ndarray], keys, rows: int,
              step: int):
    n = len(arrays["input_ids"])
    metrics = []
    for _ in range(self.config.ppo_epochs):
      self.rng, key = jax.random.split(self.rng)
      order = np.asarray(jax.random.permutation(key, n))
      for i in range(0, n, rows):
        mb = trainer.batch_sharding({k: jnp.asarray(arrays[k][order[i:i + rows]]) for k in keys})
        self.rng, key = jax.random.split(self.rng)
        state = state.replace(schedule_step=np.int32(step))  # every update of a step: its lr
        state, m = trainer.update(state, mb, key)
        metrics.append(jax.device_get(m))
    return state, {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]}

  def _correct(self, samples: Dict[str, np.ndarray], packing, arrays: Dict[str, np.ndarray],
               step: int, metrics: Dict[str, float]) -> None:
    """The rollout correction (rollx.algos.correction): the importance weights of the
    actor's loss, packed into `arrays["is_weight"]` unless the mode is none, and the
    train/infer mismatch metrics, from the samples' behaviour log-probs (if any)."""
    behaviour = samples.get("behaviour_logp")
    if behaviour is None:
      return
    old = packing.unpack(arrays["old_logp"])
    mask = samples["response_mask"]
    weights, raw, changed = correction.importance_weights(
        self.correction, old, behaviour, mask, self.config.rollout_correction_threshold)
    versions = samples.get("token_versions", np.full(mask.shape, step, np.int32))
    metrics.update(correction.mismatch_metrics(old, behaviour, mask, versions, step, raw,
                                               changed))
    if self.correction != "none":
      arrays["is_weight"] = packing.pack(weights)

  def learn(self, batch: RolloutBatch, samples: Dict[str, np.ndarray],
            adv: Optional[np.ndarray], returns: Optional[np.ndarray], step: int,
            metrics: Dict[str, float]) -> None:
    """Log-probs (and values), advantages where not yet known (`adv` None), the critic
    and actor updates, the KL controller; metrics added to `metrics`."""
    c = self.config
    min_minibatches = 1
    token_weighted = c.loss_agg_mode in losses.TOKEN_WEIGHTED_MODES
    if c.loss_agg_mode == "seq-mean-token-mean":
      # each sample's mean as a token mean of weighted tokens (exact), so that it packs;
      # the masked means logged (kl, approx_kl, clip_fraction) then weigh samples alike too
      samples = dict(samples, response_mask=packing_lib.per_sample_mean_weights(
          samples["response_mask"]))
    if adv is not None and c.merge_identical_samples and token_weighted:
      # Equal samples run the model once, weighted by their count (exact: see
      # packing.merge_identical). The step keeps the minibatch count the unmerged
      # samples would have had: the same number of optimizer updates, each on a
      # random share of the samples, so only compute changes, not the optimisation.
      lengths = samples["segment_ids"].sum(axis=1)
      unmerged = packing_lib.plan(lengths, c.sequence_length, self.minibatch,
                                  granule=self.granule)
      min_minibatches = unmerged.num_rows // unmerged.minibatch_rows
      samples, adv, returns, merged = packing_lib.merge_samples(
          samples, adv, returns,
          also_equal="behaviour_logp" if self.correction != "none" and "behaviour_logp" in samples
          else None)
      metrics["packing/distinct_samples"] = float(len(merged.index) / len(lengths))
    # Packed rows for everything that runs the model; the unpacked [N, T] view for
    # the per-sample advantage computation (rollx.trainer.packing).
    packing = packing_lib.plan(samples["segment_ids"].sum(axis=1), c.sequence_length,
                               self.minibatch, pack=token_weighted,
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
    inputs = {k: arrays[k] for k in ("input_ids", "segment_ids", "score_index") if k in arrays}
    t = time.time()
    # These passes run a trainer's microbatch of rows at a time (the minibatch over
    # gradient_accumulation_steps): the rows a device was sized for. A whole minibatch
    # of 64 rows x 3072 tokens needed 6.2 GB of XLA temp buffers (default model,
    # configs/sokoban.py:multiturn), a microbatch of 8 rows 0.8 GB.
    actor_rows, critic_rows = (rows // trainer.grad_accum if trainer else rows
                               for trainer in (self.actor, self.critic))
    arrays["old_logp"] = self._chunked(self.actor.compute_logprobs,
                                       self.actor.model_params(self.actor_state), inputs,
                                       actor_rows)
    if self.kl_on:
      arrays["ref_logp"] = self._chunked(self.reference.compute_logprobs,
                                         self.reference_params(), inputs, actor_rows)
    if self.use_critic:
      values_in = {k: arrays[k] for k in ("input_ids", "segment_ids")}
      arrays["old_values"] = self._chunked(self.critic.compute_values, self.critic_state.params,
                                           values_in, critic_rows)
    metrics["time/logprobs"] = time.time() - t
    # the least likely sampled token under the trainer's policy: ~-15 from vocabulary-tail
    # sampling at T=1 (measured from step 0); far below, the server samples off-policy
    response = arrays["response_mask"] > 0
    metrics["rollout/min_token_logp"] = float(arrays["old_logp"][response].min(initial=0.0))
    self._correct(samples, packing, arrays, step, metrics)
    if adv is None:
      per_sample = {k: packing.unpack(arrays[k]) for k in ("old_logp", "ref_logp", "old_values")
                    if k in arrays}
      per_sample["response_mask"] = batch.response_mask
      adv, returns = adv_lib.for_batch(batch, per_sample, c, self.kl_ctrl.coef)
    arrays["advantages"], arrays["returns"] = packing.pack(adv), packing.pack(returns)
    metrics["packing/rows"] = float(packing.num_rows)
    metrics["packing/fill"] = float(samples["segment_ids"].sum() / arrays["input_ids"].size)
    t = time.time()
    if self.use_critic:
      self.critic_state, m = self._update(
          self.critic, self.critic_state, arrays,
          ("input_ids", "segment_ids", "response_mask", "old_values", "returns"), rows, step)
      metrics.update({f"critic/{k}": v for k, v in m.items()})
    if step >= c.critic_warmup:
      keys = ("input_ids", "segment_ids", "response_mask", "old_logp", "advantages") + (
          ("ref_logp",) if c.use_kl_loss else ()) + (
          ("score_index",) if score_index is not None else ()) + (
          ("is_weight",) if "is_weight" in arrays else ())
      self.actor_state, m = self._update(self.actor, self.actor_state, arrays, keys, rows, step)
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
