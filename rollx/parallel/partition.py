"""Partition rules for the decoder's params: logical axes per param, logical -> mesh.

Megatron-style tensor parallelism falls out of the logical names: q/k/v and
gate/up are column-parallel (their output axis, `heads` / `kv_heads` / `mlp`, is
split over `tensor`), o_proj and down_proj are row-parallel (their input axis is
split), so each attention block and MLP needs one all-reduce. `embed` maps to
`fsdp`: every weight is also split along the model dimension over the fsdp axis
(ZeRO-3), gathered by XLA where it is used; the optimizer state inherits the same
specs. `layers` maps to `pipeline`: stage s holds a contiguous slice of layers.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rollx.errors import ConfigError
from rollx.models.llm import ModelConfig
from rollx.parallel.mesh import FSDP, PIPELINE, STRATEGY_KEYS, TENSOR

# Logical axes of every param, by name (layer params carry the leading `layers`).
PARAM_AXES: Dict[str, Tuple] = {
    "embed_tokens": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "norm": (None,),
    "value_head": ("embed",),
    "value_bias": (),
    "input_layernorm": ("layers", None),
    "post_attention_layernorm": ("layers", None),
    "q_proj": ("layers", "embed", "heads", None),
    "k_proj": ("layers", "embed", "kv_heads", None),
    "v_proj": ("layers", "embed", "kv_heads", None),
    "q_bias": ("layers", "heads", None),
    "k_bias": ("layers", "kv_heads", None),
    "v_bias": ("layers", "kv_heads", None),
    "o_proj": ("layers", "heads", None, "embed"),
    "o_bias": ("layers", None),
    "gate_proj": ("layers", "embed", "mlp"),
    "up_proj": ("layers", "embed", "mlp"),
    "down_proj": ("layers", "mlp", "embed"),
    # LoRA adapters (rollx.models.lora): A takes its kernel's input split, B its output
    # split, so h A and (h A) B shard as h W does; the rank axis is small and replicated.
    "q_proj_lora_a": ("layers", "embed", None),
    "q_proj_lora_b": ("layers", None, "heads", None),
    "k_proj_lora_a": ("layers", "embed", None),
    "k_proj_lora_b": ("layers", None, "kv_heads", None),
    "v_proj_lora_a": ("layers", "embed", None),
    "v_proj_lora_b": ("layers", None, "kv_heads", None),
    "o_proj_lora_a": ("layers", "heads", None, None),
    "o_proj_lora_b": ("layers", None, "embed"),
    "gate_proj_lora_a": ("layers", "embed", None),
    "gate_proj_lora_b": ("layers", None, "mlp"),
    "up_proj_lora_a": ("layers", "embed", None),
    "up_proj_lora_b": ("layers", None, "mlp"),
    "down_proj_lora_a": ("layers", "mlp", None),
    "down_proj_lora_b": ("layers", None, "embed"),
}

LOGICAL_RULES = {
    "layers": PIPELINE,
    "heads": TENSOR,
    "kv_heads": TENSOR,
    "mlp": TENSOR,
    "vocab": TENSOR,
    "embed": FSDP,
}
# Axes that replicate instead of failing when their size does not divide: a vocab
# of 151,936 or a model dim need not be a multiple of the mesh.
_BEST_EFFORT = ("vocab", "embed")


def check_model_fits(config: ModelConfig, mesh: Mesh, role: str = "actor_train") -> None:
  """Sizes the mesh must divide; a ConfigError naming the strategy key otherwise."""
  errors = []
  tp, pp = mesh.shape[TENSOR], mesh.shape[PIPELINE]
  for name, size in (("num_attention_heads", config.num_heads),
                     ("num_key_value_heads", config.num_kv_heads),
                     ("intermediate_size", config.intermediate_size)):
    if size % tp:
      errors.append((f"{role}.strategy_args.{STRATEGY_KEYS[TENSOR]}",
                     f"tp_size={tp} does not divide the model's {name}={size}"))
  if config.num_layers % pp:
    errors.append((f"{role}.strategy_args.{STRATEGY_KEYS[PIPELINE]}",
                   f"pp_size={pp} does not divide the model's num_hidden_layers="
                   f"{config.num_layers}"))
  if errors:
    raise ConfigError(errors)


def spec_for(name: str, shape: Tuple[int, ...], mesh: Mesh) -> P:
  axes = PARAM_AXES[name]
  if len(axes) != len(shape):
    raise ValueError(f"param {name!r} has shape {shape}, rules expect axes {axes}")
  spec = []
  for logical, dim in zip(axes, shape):
    mesh_axis = LOGICAL_RULES.get(logical)
    if mesh_axis is None or mesh.shape[mesh_axis] == 1:
      spec.append(None)
    elif dim % mesh.shape[mesh_axis]:
      if logical not in _BEST_EFFORT:
        raise ValueError(f"param {name!r} axis {logical}={dim} is not divisible by mesh "
                         f"axis {mesh_axis}={mesh.shape[mesh_axis]}")
      spec.append(None)
    else:
      spec.append(mesh_axis)
  return P(*spec)


def param_shardings(params: Any, mesh: Mesh):
  """NamedShardings for a param tree (arrays or ShapeDtypeStructs), by leaf name."""
  def leaf(path, x):
    return NamedSharding(mesh, spec_for(path[-1].key, tuple(x.shape), mesh))
  return jax.tree_util.tree_map_with_path(leaf, params)


def tree_shardings(tree: Any, params_shardings, mesh: Mesh):
  """Shardings for an optimizer-state tree: leaves shaped like a param take its
  sharding (Adam moments mirror the params); everything else is replicated."""
  flat_params = {tuple(_keys(p)): s for p, s in
                 jax.tree_util.tree_flatten_with_path(params_shardings)[0]}

  def leaf(path, x):
    keys = tuple(_keys(path))
    for n in range(len(keys)):
      if keys[n:] in flat_params:
        return flat_params[keys[n:]]
    return NamedSharding(mesh, P())
  return jax.tree_util.tree_map_with_path(leaf, tree)


def _keys(path):
  return [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
