"""One role's sharded training: state on a mesh, the jitted step, log-probs and values.

    trainer = Trainer(model_config, worker_config, mesh, loss_fn, total_steps)
    state = trainer.init_state(params)              # sharded by the partition rules
    state, metrics = trainer.update(state, batch, rng)   # state donated
    logp, entropy = trainer.compute_logprobs(state.params, batch)

`loss_fn(model, params, batch, rng) -> (loss, aux_metrics)` is the algorithm's
(PPO policy loss, value loss, ...). An optional trust region `(kl_fn, max_kl)` bounds
how far one update may move the policy (`kl_fn(model, params, batch)`: the policy's
distance from the batch's rollout policy; the loss must report the same figure as aux
`approx_kl`). The step is pure and compiled once per batch shape: the state goes in
donated with its shardings and comes out with the same ones, the batch is split over
data x fsdp, gradients are accumulated over
`gradient_accumulation_steps` microbatches inside the step, then clipped and
applied by optax.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import optax

from rollx.models import llm, logprobs, lora as lora_lib
from rollx.parallel import partition
from rollx.parallel import pipeline
from rollx.parallel.mesh import BATCH_AXES, PIPELINE
from rollx.trainer.state import TrainState, lr_schedule, make_optimizer, new_state

Batch = Dict[str, jax.Array]
LossFn = Callable[[llm.Transformer, Any, Batch, jax.Array], Tuple[jax.Array, Dict[str, jax.Array]]]
KLFn = Callable[[llm.Transformer, Any, Batch], jax.Array]
# forward passes the trust region's line search may add after the one measuring the full update
TRUST_REGION_EVALS = 4


class Trainer:

  def __init__(self, model_config: llm.ModelConfig, worker, mesh: Mesh, loss_fn: LossFn,
               total_steps: int, head: str = "lm", role: str = "actor_train",
               trust_region: Optional[Tuple[KLFn, float]] = None,
               weight_fn: Optional[Callable[[Batch], jax.Array]] = None,
               temperature: float = 1.0):
    partition.check_model_fits(model_config, mesh, role)
    self.mesh, self.role, self.loss_fn, self.head = mesh, role, loss_fn, head
    self.trust_region = trust_region
    # compute_logprobs scores softmax(logits / temperature): the rollout's sampling
    # distribution, so that old log-probs and the behaviour's are comparable
    self.temperature = float(temperature)
    # A microbatch's share of the minibatch's loss: its loss's denominator (tokens for
    # token-mean, sequences for the seq-mean modes), so that any split into
    # microbatches gives the one-pass loss and gradient. None: equal shares.
    self.weight_fn = weight_fn or (lambda mb: jnp.float32(1.0))
    self.config = model_config
    self.grad_accum = int(worker.training_args.gradient_accumulation_steps)
    dtype = llm.DTYPES[worker.model_args.dtype]
    remat = not worker.model_args.disable_gradient_checkpointing
    block = int(worker.model_args.attention_block)
    # LoRA (rollx.models.lora): the state's params are the adapters, the base is frozen
    self.lora = lora_lib.from_config(worker.model_args.get("lora"), f"{role}.model_args.lora")
    scale = self.lora.scale if self.lora else None
    layers_fn = None
    if mesh.shape[PIPELINE] > 1:
      layers_fn = functools.partial(pipeline.pipelined_layers, model_config, dtype, remat, mesh,
                                    int(worker.strategy_args.num_microbatches),
                                    attention_block=block, lora_scale=scale)
    residual = NamedSharding(mesh, P(BATCH_AXES, None, None))
    self.model = llm.make_model(
        model_config, worker.model_args.dtype, remat, head, layers_fn=layers_fn,
        attention_block=block, lora_scale=scale,
        activation_constraint=functools.partial(jax.lax.with_sharding_constraint,
                                                shardings=residual))
    self.tx = make_optimizer(worker.training_args)
    self.lr_schedule = lr_schedule(worker.training_args, total_steps)

    # Shapes first (eval_shape: nothing allocated), then shardings from the rules.
    abstract_params = jax.eval_shape(
        lambda: llm.init_params(llm.make_model(model_config, head=head), jax.random.PRNGKey(0)))
    abstract_frozen = None
    if self.lora:
      # The frozen matrices in the compute dtype: the model casts them to it where it uses
      # them anyway (exact), so a bf16 run keeps 2 bytes per base weight, not 4. Norms and
      # biases stay float32, as the model reads them.
      abstract_frozen = jax.tree_util.tree_map_with_path(
          lambda path, x: jax.ShapeDtypeStruct(
              x.shape, x.dtype if path[-1].key.endswith(("norm", "_bias")) else dtype),
          abstract_params)
      abstract_params = jax.eval_shape(
          lambda: lora_lib.init_adapters(abstract_frozen, self.lora, jax.random.PRNGKey(0)))
    trainable = partition.param_shardings(abstract_params, mesh)
    frozen = None if abstract_frozen is None else partition.param_shardings(abstract_frozen, mesh)
    # the model's whole tree (base and adapters): what the log-prob and value passes take
    self.param_shardings = trainable if frozen is None else lora_lib.combine(frozen, trainable)
    abstract_state = jax.eval_shape(functools.partial(new_state, tx=self.tx), abstract_params,
                                    frozen=abstract_frozen)
    self.state_shardings = TrainState(
        step=NamedSharding(mesh, P()), params=trainable,
        opt_state=partition.tree_shardings(abstract_state.opt_state, trainable, mesh),
        schedule_step=NamedSharding(mesh, P()), frozen=frozen)
    self.abstract_state = abstract_state
    self.num_traces = 0  # how often `update` was traced (tests: compiled once)

    rep = NamedSharding(mesh, P())
    self._new_state = jax.jit(lambda params, frozen: new_state(params, self.tx, frozen),
                              in_shardings=(trainable, frozen),
                              out_shardings=self.state_shardings, donate_argnums=(0, 1))
    self.update = jax.jit(self._update, in_shardings=(self.state_shardings, None, rep),
                          out_shardings=(self.state_shardings, rep), donate_argnums=0)
    # with adapters the passes also take the base tree alone (the KL reference): its
    # arrays arrive sharded already, so no placement is pinned
    params_in = None if self.lora else self.param_shardings
    self.compute_logprobs = jax.jit(self._logprobs, in_shardings=(params_in, None))
    self.compute_values = jax.jit(self._values, in_shardings=(params_in, None))

  # -- state -------------------------------------------------------------------
  def init_state(self, params, rng=None) -> TrainState:
    """A sharded TrainState from host/device params (e.g. loaded from an HF dir). With
    LoRA: `params` is the base, with or without adapters; without, fresh ones from `rng`."""
    if not self.lora:
      return self._new_state(jax.device_put(params, self.state_shardings.params), None)
    base, adapters = lora_lib.split(params)
    # (no copy where the dtype is already the state's: a 7B base is 28 GB on host)
    base = jax.tree.map(lambda x, like: np.asarray(x).astype(like.dtype, copy=False), base,
                        self.abstract_state.frozen)
    base = jax.device_put(base, self.state_shardings.frozen)
    if adapters:
      adapters = jax.device_put(adapters, self.state_shardings.params)
    else:
      abstract = self.abstract_state.frozen
      rng = jax.random.PRNGKey(0) if rng is None else rng
      adapters = jax.jit(lambda r: lora_lib.init_adapters(abstract, self.lora, r),
                         out_shardings=self.state_shardings.params)(rng)
    return self._new_state(adapters, base)

  def model_params(self, state: TrainState):
    """The model's whole params tree of `state`: the base and its adapters (no copies)."""
    return _whole(state.params, state.frozen)

  def batch_sharding(self, batch: Batch) -> Batch:
    return {k: jax.device_put(v, NamedSharding(self.mesh, P(BATCH_AXES, *([None] * (v.ndim - 1)))))
            for k, v in batch.items()}

  # -- jitted functions ------------------------------------------------------------
  def _micro(self, batch: Batch) -> Batch:
    """[rows, ...] -> [k, rows / k, ...], k = `gradient_accumulation_steps`. Strided
    (row r -> microbatch r % k): rows stay on their data shard."""
    k = self.grad_accum
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1),
                        batch)

  def _weights(self, micro: Batch) -> jax.Array:
    """[k] each microbatch's share (sums to 1)."""
    w = jax.lax.map(self.weight_fn, micro).astype(jnp.float32)
    return w / jnp.maximum(w.sum(), 1e-12)

  def grads(self, params, batch: Batch, rng: jax.Array, frozen=None):
    """Loss and gradients (of `params`, not of `frozen`) of the minibatch, accumulated
    over `gradient_accumulation_steps` microbatches, each weighted by its share (the
    update's first half; traceable, for tests that compare gradients)."""
    k = self.grad_accum
    micro = self._micro(batch)
    grad_fn = jax.value_and_grad(
        lambda p, mb, r: self.loss_fn(self.model, _whole(p, frozen), mb, r), has_aux=True)

    def accumulate(carry, xs):
      grads_sum, loss_sum = carry
      mb, r, w = xs
      (loss, aux), grads = grad_fn(params, mb, r)
      return (jax.tree.map(lambda a, g: a + w * g, grads_sum, grads), loss_sum + w * loss), aux

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, loss), aux = jax.lax.scan(accumulate, (zeros, jnp.zeros((), jnp.float32)),
                                      (micro, jax.random.split(rng, k), self._weights(micro)))
    return loss, grads, aux

  def _update(self, state: TrainState, batch: Batch, rng: jax.Array):
    self.num_traces += 1
    loss, grads, aux = self.grads(state.params, batch, rng, state.frozen)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    lr = self.lr_schedule(state.schedule_step)
    updates = jax.tree.map(lambda u: (u * lr).astype(u.dtype), updates)
    metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), "lr": lr}
    metrics.update(jax.tree.map(lambda a: a.mean(), aux))
    if self.trust_region is not None:
      updates, tr_metrics = self._trust_region(state.params, updates, batch,
                                               metrics["approx_kl"], state.frozen)
      metrics.update(tr_metrics)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         schedule_step=state.schedule_step + 1), metrics

  def _trust_region(self, params, updates, batch: Batch, kl_before: jax.Array, frozen=None):
    """Scale `updates` so the policy's KL from the rollout policy on this minibatch ends
    at most about `max_kl` (returns the scaled updates and their metrics).

    Why: an Adam step moves every weight by about the learning rate whatever the
    gradient's size, and at lr 1e-3 one such update moved a 0.7M-parameter policy by
    several nats (every answer invalid at the next step, never recovered; measured on
    configs/frozenlake.py, seed 3, step 10). The KL along an update is not quadratic
    beyond ~1e-3 (it grows about linearly, measured in tests/trainer/test_step.py), so
    the scale s comes from a line search: s <- s (max_kl - kl_before) / (KL(s) -
    kl_before), at most TRUST_REGION_EVALS forward passes, none when the full update is
    within the bound. A minibatch that starts beyond `max_kl` (drift from the step's
    earlier minibatches) gets s = 0 unless its full update lands inside: PPO's early
    stop at a target KL. The optimizer's moments keep the full gradient; only the
    applied move is scaled. Memory: one more copy of the params while measuring.
    """
    kl_fn, max_kl = self.trust_region
    micro = self._micro(batch)

    shares = self._weights(micro)

    def kl_at(scale):
      moved = _whole(jax.tree.map(lambda p, u: p + (u * scale).astype(p.dtype), params,
                                  updates), frozen)
      return (jax.lax.map(lambda mb: kl_fn(self.model, moved, mb), micro) * shares).sum()

    room = jnp.maximum(max_kl - kl_before, 0.0)
    proposed = kl_at(jnp.float32(1.0))

    def shrink(carry):
      scale, kl, evals = carry
      scale = scale * room / jnp.maximum(kl - kl_before, 1e-12)
      scale = jnp.where(room > 0, scale, 0.0)
      # no room: s = 0 is known, and staying put costs no forward pass
      kl = jax.lax.cond(room > 0, kl_at, lambda _: kl_before, scale)
      return scale, kl, evals + 1

    def too_far(carry):
      scale, kl, evals = carry
      return (kl > max_kl) & (scale > 0) & (evals < TRUST_REGION_EVALS)

    scale, landed, _ = jax.lax.while_loop(too_far, shrink,
                                          (jnp.float32(1.0), proposed, jnp.int32(0)))
    updates = jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates)
    return updates, {"proposed_kl": proposed, "update_kl": landed, "update_scale": scale}

  def _logprobs(self, params, batch: Batch):
    return logprobs.compute_logprobs(self.model, params, batch["input_ids"],
                                     batch.get("segment_ids"), batch.get("score_index"),
                                     self.temperature)

  def _values(self, params, batch: Batch):
    return logprobs.compute_values(self.model, params, batch["input_ids"], batch.get("segment_ids"))


def _whole(params, frozen):
  """The model's params tree: `params` alone, or the frozen base with `params` its adapters."""
  return params if frozen is None else lora_lib.combine(frozen, params)
