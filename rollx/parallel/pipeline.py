"""GPipe-style pipeline parallelism over the `pipeline` mesh axis.

The stacked layer params `[L, ...]` (sharded over `pipeline` on axis 0) are viewed
as `[S, L/S, ...]`: stage s owns layers `s*L/S ... (s+1)*L/S - 1`. The batch is cut
into M microbatches. A buffer `[S, B/M, T, d]`, sharded over stages, holds what
each stage works on; every iteration, stage 0 takes the next microbatch, every
other stage takes its left neighbour's previous output (`jnp.roll` along the
stage-sharded axis, which XLA lowers to a collective permute), and all stages run
their layers at once (`vmap` over the stage axis with `spmd_axis_name`, so each
device computes only its own stage). After M + S - 1 iterations the last stage has
emitted every microbatch; the bubble is (S - 1) / (M + S - 1) of the work.
The backward pass is JAX's autodiff of the same scan (GPipe: all microbatches
forward, then all backward). Per-microbatch inputs that the layers need besides
the activations (RoPE tables, attention masks) travel through the stages with them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rollx.models import llm
from rollx.parallel import partition
from rollx.parallel.mesh import BATCH_AXES, PIPELINE


def _microbatch(x, m):
  # Strided split (row r goes to microbatch r % m) keeps each data shard's rows on
  # its own devices: no resharding of the batch axis.
  return x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1)


def _unmicrobatch(x):
  return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def pipelined_layers(config: llm.ModelConfig, dtype, remat: bool, mesh: Mesh,
                     num_microbatches: int, layer_params, x_btd, cos_bth, sin_bth, mask_bts,
                     attention_block: int = llm.ATTENTION_BLOCK,
                     lora_scale=None):
  """Drop-in for the layer stack (`Transformer.layers_fn`)."""
  s, m = mesh.shape[PIPELINE], num_microbatches
  b = x_btd.shape[0]
  if b % m:
    raise ValueError(f"batch of {b} rows is not divisible by num_microbatches={m}")

  def to_stages(path, p):
    spec = partition.spec_for(path[-1].key, p.shape, mesh)
    staged = p.reshape(s, p.shape[0] // s, *p.shape[1:])
    return jax.lax.with_sharding_constraint(
        staged, NamedSharding(mesh, P(spec[0], None, *spec[1:])))

  stage_params = jax.tree_util.tree_map_with_path(to_stages, layer_params)
  inputs = [_microbatch(a, m) for a in (x_btd, cos_bth, sin_bth, mask_bts)]

  def stage_sharded(a):
    spec = P(PIPELINE, BATCH_AXES, *([None] * (a.ndim - 2)))
    return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

  buffers = [stage_sharded(jnp.zeros((s,) + a.shape[1:], a.dtype)) for a in inputs]
  outputs = jnp.zeros_like(inputs[0])
  run_stage = jax.vmap(functools.partial(llm.run_layers, config, dtype, remat,
                                         attention_block=attention_block,
                                         lora_scale=lora_scale),
                       spmd_axis_name=PIPELINE)

  def iteration(carry, i):
    buffers, outputs = carry
    take = jnp.minimum(i, m - 1)
    shifted = [stage_sharded(jnp.roll(buf, 1, axis=0).at[0].set(src[take]))
               for buf, src in zip(buffers, inputs)]
    y = stage_sharded(run_stage(stage_params, *shifted))
    # Microbatch i - (S - 1) leaves the last stage now. Before the pipe is full
    # (i < S - 1) this writes garbage into slot 0, overwritten at i = S - 1.
    done = jnp.maximum(i - (s - 1), 0)
    outputs = jax.lax.dynamic_update_index_in_dim(outputs, y[s - 1], done, 0)
    return ([y] + shifted[1:], outputs), None

  (_, outputs), _ = jax.lax.scan(iteration, (buffers, outputs), jnp.arange(m + s - 1))
  return _unmicrobatch(outputs)
