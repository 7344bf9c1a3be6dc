"""Low-rank adapters (LoRA, Hu et al. 2021, arXiv:2106.09685) on the decoder's projections.

A targeted projection `W` (frozen) gains `scale * A @ B`: `A` maps the kernel's input
axes to `rank`, `B` maps `rank` to its output axes, in the kernel's own layout
(`q_proj_lora_a: [L, d, r]`, `q_proj_lora_b: [L, r, H, hd]`; `o_proj`'s input is its
`[H, hd]` axes). `scale` is `alpha / rank`, or `alpha / sqrt(rank)` with `rslora`
(Kalajdzievski 2023, arXiv:2312.03732). A starts random, B at zero, so training starts
from the base model exactly.

Adapters are leaves beside their kernel in the params tree (`layers.q_proj_lora_a`), and
the decoder applies one wherever its leaves are present: the base tree alone is the base
model (the KL reference, a server before its first sync), with no second copy of the
weights. `split` / `combine` move between the two views, `merge` folds adapters into the
kernels (servers, HF export), `AdapterWeights` is what a weight sync sends.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from rollx.config import LORA_PROJECTIONS as PROJECTIONS
from rollx.errors import ConfigError

# a kernel's input axes (after the leading `layers` axis); its other axes are outputs
INPUT_AXES = {"o_proj": 2}
SUFFIX_A, SUFFIX_B = "_lora_a", "_lora_b"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  rank: int
  alpha: float
  targets: Tuple[str, ...]
  rslora: bool = False

  @property
  def scale(self) -> float:
    return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def from_config(block, key: str = "actor_train.model_args.lora") -> Optional[LoraConfig]:
  """The `model_args.lora` block as a LoraConfig (None when `rank` is 0); a ConfigError
  naming the key for a bad value. `target_modules`: projection names, or a regex searched
  in each projection's parameter path (`layers/q_proj`, ...)."""
  if block is None or int(block.rank) == 0:
    return None
  errors = []
  if int(block.rank) < 0:
    errors.append((f"{key}.rank", f"must be >= 0 (0: no adapters), got {block.rank}"))
  if not float(block.alpha) > 0:
    errors.append((f"{key}.alpha", f"must be > 0, got {block.alpha}"))
  targets = block.target_modules
  if isinstance(targets, str):
    try:
      pattern = re.compile(targets)
    except re.error as e:
      raise ConfigError([(f"{key}.target_modules", f"not a regex: {e}")]) from None
    targets = tuple(n for n in PROJECTIONS if pattern.search(f"layers/{n}"))
    if not targets:
      errors.append((f"{key}.target_modules", f"{block.target_modules!r} matches none of "
                     f"{', '.join('layers/' + n for n in PROJECTIONS)}"))
  else:
    unknown = [t for t in targets if t not in PROJECTIONS]
    if unknown or not targets:
      errors.append((f"{key}.target_modules", f"{', '.join(map(repr, unknown)) or 'none'}: "
                     f"name projections of {', '.join(PROJECTIONS)}"))
  if errors:
    raise ConfigError(errors)
  return LoraConfig(int(block.rank), float(block.alpha),
                    tuple(n for n in PROJECTIONS if n in targets), bool(block.rslora))


def check_adapter_dir(block, model_config, key: str = "actor_train.model_args.lora"):
  """The adapters of `block.adapter_dir` for `model_config`'s base (None when unset); a
  ConfigError naming `adapter_dir` when it cannot be read or its settings are not the
  block's."""
  if block is None or not block.get("adapter_dir"):
    return None
  from rollx.models.hf import CheckpointError
  wanted = from_config(block, key)
  try:
    adapters, found = load_peft(block.adapter_dir, model_config)
  except (CheckpointError, ValueError, OSError) as e:
    raise ConfigError([(f"{key}.adapter_dir", str(e))]) from None
  if found != wanted:
    raise ConfigError([(f"{key}.adapter_dir", f"{block.adapter_dir} holds adapters of rank "
                        f"{found.rank}, alpha {found.alpha}, targets {list(found.targets)}, "
                        f"rslora {found.rslora}; set {key} to match")])
  return adapters


def is_adapter(name: str) -> bool:
  return name.endswith((SUFFIX_A, SUFFIX_B))


def init_adapters(base, lora: LoraConfig, rng: jax.Array) -> Dict[str, Any]:
  """Fresh adapters for the base params tree (arrays or ShapeDtypeStructs), fp32: A
  Gaussian with std 1/sqrt(fan-in) (the LoRA paper's random A, PyTorch's linear scale),
  B zero."""
  layers, out = base["layers"], {}
  for i, name in enumerate(lora.targets):
    shape = tuple(layers[name].shape)
    n_in = 1 + INPUT_AXES.get(name, 1)  # with the leading layers axis
    fan_in = math.prod(shape[1:n_in])
    a_shape, b_shape = (*shape[:n_in], lora.rank), (shape[0], lora.rank, *shape[n_in:])
    out[name + SUFFIX_A] = (jax.random.normal(jax.random.fold_in(rng, i), a_shape, jnp.float32)
                            / math.sqrt(fan_in))
    out[name + SUFFIX_B] = jnp.zeros(b_shape, jnp.float32)
  return {"layers": out}


def split(params) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """(base, adapters) of a params tree; adapters {} when it has none."""
  base, adapters = {}, {}
  for k, v in params.items():
    if isinstance(v, dict):
      b, a = split(v)
      base[k] = b
      if a:
        adapters[k] = a
    elif is_adapter(k):
      adapters[k] = v
    else:
      base[k] = v
  return base, adapters


def combine(base, adapters):
  """The params tree with both (the inverse of `split`; no array is copied)."""
  out = dict(base)
  for k, v in adapters.items():
    out[k] = combine(base.get(k, {}), v) if isinstance(v, dict) else v
  return out


def delta(a, b, name: str):
  """A @ B in the kernel's layout: [L, *in, r] x [L, r, *out] -> [L, *in, *out]."""
  xp = np if isinstance(a, np.ndarray) else jnp
  n_in = INPUT_AXES.get(name, 1)
  in_shape, out_shape = a.shape[1:1 + n_in], b.shape[2:]
  flat = xp.einsum("lkr,lrn->lkn", a.reshape(a.shape[0], -1, a.shape[-1]),
                   b.reshape(b.shape[0], b.shape[1], -1))
  return flat.reshape(a.shape[0], *in_shape, *out_shape)


def merge(base, adapters, scale: float):
  """The base tree with each adapter folded into its kernel: W + scale * A @ B (numpy
  in, numpy out; traceable under jit)."""
  layers = dict(base["layers"])
  for key in adapters.get("layers", {}):
    if key.endswith(SUFFIX_A):
      name = key[:-len(SUFFIX_A)]
      w = layers[name]
      d = delta(adapters["layers"][key], adapters["layers"][name + SUFFIX_B], name)
      layers[name] = (w.astype(np.float32) + scale * d).astype(w.dtype)
  return {**base, "layers": layers}


class AdapterWeights(NamedTuple):
  """A weight sync's payload with adapters on: the adapter tensors (host arrays) and
  their scale; a server folds them into the base it loaded (`merge`)."""
  tensors: Dict[str, Any]
  scale: float


def nbytes(tree) -> int:
  """Bytes of a tree's arrays (a weight sync's payload; AdapterWeights' scale is no array)."""
  return sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "nbytes"))


# -- PEFT adapter directories (adapter_config.json + adapter_model.safetensors) --------------
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def _peft_names(cfg, name: str, i: int) -> Tuple[str, str]:
  """PEFT's tensor names of projection `name`'s A and B in layer i."""
  from rollx.models import hf
  module = "base_model.model." + hf.layer_tensor_names(cfg, i)[name][:-len(".weight")]
  return module + ".lora_A.weight", module + ".lora_B.weight"


def save_peft(adapters, lora: LoraConfig, cfg, out_dir: str, base_model: str = "") -> str:
  """Writes a PEFT LoRA directory that `peft.PeftModel.from_pretrained` loads onto the
  transformers base (torch's [out, in] layout: lora_A [r, in], lora_B [out, r])."""
  import json
  import os
  from safetensors.numpy import save_file
  layers = jax.device_get(adapters)["layers"]
  tensors = {}
  for name in lora.targets:
    a, b = np.asarray(layers[name + SUFFIX_A], np.float32), np.asarray(layers[name + SUFFIX_B],
                                                                       np.float32)
    for i in range(a.shape[0]):
      key_a, key_b = _peft_names(cfg, name, i)
      tensors[key_a] = np.ascontiguousarray(a[i].reshape(-1, lora.rank).T)
      tensors[key_b] = np.ascontiguousarray(b[i].reshape(lora.rank, -1).T)
  os.makedirs(out_dir, exist_ok=True)
  save_file(tensors, os.path.join(out_dir, PEFT_WEIGHTS), metadata={"format": "pt"})
  with open(os.path.join(out_dir, PEFT_CONFIG), "w") as f:
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
               "lora_alpha": lora.alpha, "use_rslora": lora.rslora,
               "target_modules": list(lora.targets), "lora_dropout": 0.0, "bias": "none",
               "fan_in_fan_out": False, "inference_mode": True,
               "base_model_name_or_path": base_model}, f, indent=2)
  return out_dir


def load_peft(adapter_dir: str, cfg) -> Tuple[Dict[str, Any], LoraConfig]:
  """(adapters, LoraConfig) of a PEFT LoRA directory written by `save_peft` or by peft
  itself for a Qwen2 / Llama base of config `cfg`."""
  import json
  import os
  from safetensors.numpy import load_file
  from rollx.models.hf import CheckpointError
  path = os.path.join(adapter_dir, PEFT_CONFIG)
  try:
    with open(path) as f:
      meta = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: not a PEFT adapter directory ({e})") from None
  if meta.get("peft_type") != "LORA" or meta.get("bias", "none") != "none":
    raise CheckpointError(f"{path}: a LoRA adapter without biases is expected, got "
                          f"peft_type={meta.get('peft_type')!r}, bias={meta.get('bias')!r}")
  targets = meta.get("target_modules") or ()
  unknown = [t for t in targets if t not in PROJECTIONS] if not isinstance(targets, str) else [targets]
  if unknown:
    raise CheckpointError(f"{path}: target_modules {unknown} are not projections of "
                          f"{', '.join(PROJECTIONS)}")
  lora = LoraConfig(int(meta["r"]), float(meta["lora_alpha"]),
                    tuple(n for n in PROJECTIONS if n in targets), bool(meta.get("use_rslora")))
  tensors = load_file(os.path.join(adapter_dir, PEFT_WEIGHTS))
  from rollx.models import llm
  base = jax.eval_shape(lambda: llm.init_params(llm.make_model(cfg), jax.random.PRNGKey(0)))
  like = jax.eval_shape(lambda: init_adapters(base, lora, jax.random.PRNGKey(0)))["layers"]
  layers = {}
  for name in lora.targets:
    a_rows, b_rows = [], []
    for i in range(cfg.num_layers):
      key_a, key_b = _peft_names(cfg, name, i)
      if key_a not in tensors or key_b not in tensors:
        raise CheckpointError(f"{adapter_dir}: no {key_a} / {key_b}")
      a_rows.append(tensors[key_a].T.reshape(like[name + SUFFIX_A].shape[1:]))
      b_rows.append(tensors[key_b].T.reshape(like[name + SUFFIX_B].shape[1:]))
    layers[name + SUFFIX_A] = np.stack(a_rows).astype(np.float32)
    layers[name + SUFFIX_B] = np.stack(b_rows).astype(np.float32)
  return {"layers": layers}, lora
