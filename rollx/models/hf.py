"""Hugging Face directories <-> our params, and the tokenizer.

Loading reads `config.json` and the safetensors files directly (single file or
sharded with `model.safetensors.index.json`), maps each tensor into our layout and
checks its shape; every problem names the file, field or tensor. Saving writes an
ordinary HF directory (`config.json`, `model.safetensors`, tokenizer files) that
`transformers.AutoModelForCausalLM.from_pretrained` loads. Nothing touches the
network: tokenizers load with `local_files_only=True`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from rollx.models.llm import ModelConfig

SUPPORTED = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
_MODEL_TYPE_TO_ARCH = {v: k for k, v in SUPPORTED.items()}
# Reward models as transformers' AutoModelForSequenceClassification writes them: the
# causal LM's trunk, a bias-free `score` linear head in place of `lm_head`.
SEQUENCE_CLASSIFICATION = {"Qwen2ForSequenceClassification": "Qwen2ForCausalLM",
                           "LlamaForSequenceClassification": "LlamaForCausalLM"}
_SCORED_NAME = {v: k for k, v in SEQUENCE_CLASSIFICATION.items()}
# Buffers some checkpoints carry that are recomputed, not learned.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
  """A Hugging Face directory we cannot use; the message names the culprit."""


def _read_json(path: str) -> Dict[str, Any]:
  if not os.path.isfile(path):
    raise CheckpointError(f"{path}: file not found")
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def load_model_config(model_dir: str) -> ModelConfig:
  path = os.path.join(model_dir, "config.json")
  raw = _read_json(path)
  archs = raw.get("architectures") or []
  arch = next((a for a in archs if a in SUPPORTED), None)
  scored = next((a for a in archs if a in SEQUENCE_CLASSIFICATION), None)
  num_labels = 0
  if arch is None and scored is not None:
    arch = SEQUENCE_CLASSIFICATION[scored]
    # transformers stores the label count as id2label; num_labels where a writer put it
    labels = raw.get("id2label")
    num_labels = len(labels) if isinstance(labels, dict) and labels else int(
        raw.get("num_labels", 2))
    if num_labels < 1:
      raise CheckpointError(f"{path}: {scored} with no labels (id2label / num_labels)")
  if arch is None:
    arch = _MODEL_TYPE_TO_ARCH.get(raw.get("model_type", ""))
  if arch is None:
    raise CheckpointError(
        f"{path}: architectures={archs} / model_type={raw.get('model_type')!r} is not "
        f"supported; rollx loads {', '.join([*SUPPORTED, *SEQUENCE_CLASSIFICATION])}")

  def field(name, default=None, required=False):
    if name not in raw or raw[name] is None:
      if required:
        raise CheckpointError(f"{path}: required field {name!r} is missing")
      return default
    return raw[name]

  rope = raw.get("rope_parameters") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type != "default" or raw.get("rope_scaling"):
    raise CheckpointError(f"{path}: rope_parameters/rope_scaling {rope or raw.get('rope_scaling')} "
                          "is not supported (only default RoPE)")
  if field("hidden_act", "silu") != "silu":
    raise CheckpointError(f"{path}: hidden_act={raw['hidden_act']!r} is not supported (silu)")
  if field("mlp_bias", False):
    raise CheckpointError(f"{path}: mlp_bias=true is not supported")
  if field("use_sliding_window", False):
    raise CheckpointError(f"{path}: use_sliding_window=true is not supported")
  hidden = int(field("hidden_size", required=True))
  heads = int(field("num_attention_heads", required=True))
  biased = bool(field("attention_bias", False))
  eos = field("eos_token_id")
  try:
    return ModelConfig(
        vocab_size=int(field("vocab_size", required=True)),
        hidden_size=hidden,
        intermediate_size=int(field("intermediate_size", required=True)),
        num_layers=int(field("num_hidden_layers", required=True)),
        num_heads=heads,
        num_kv_heads=int(field("num_key_value_heads", heads)),
        head_dim=int(field("head_dim", hidden // heads)),
        rope_theta=float(rope.get("rope_theta", field("rope_theta", 10000.0))),
        rms_norm_eps=float(field("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(field("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM" or biased,
        o_bias=arch == "LlamaForCausalLM" and biased,
        max_position_embeddings=int(field("max_position_embeddings", 4096)),
        initializer_range=float(field("initializer_range", 0.02)),
        architecture=arch,
        bos_token_id=field("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
        pad_token_id=field("pad_token_id"),
        num_labels=num_labels,
    )
  except ValueError as e:
    raise CheckpointError(f"{path}: {e}") from None


def layer_tensor_names(cfg: ModelConfig, i: int) -> Dict[str, str]:
  """Our per-layer param name -> the HF tensor name of layer i."""
  pre = f"model.layers.{i}."
  names = {
      "input_layernorm": pre + "input_layernorm.weight",
      "post_attention_layernorm": pre + "post_attention_layernorm.weight",
      "q_proj": pre + "self_attn.q_proj.weight",
      "k_proj": pre + "self_attn.k_proj.weight",
      "v_proj": pre + "self_attn.v_proj.weight",
      "o_proj": pre + "self_attn.o_proj.weight",
      "gate_proj": pre + "mlp.gate_proj.weight",
      "up_proj": pre + "mlp.up_proj.weight",
      "down_proj": pre + "mlp.down_proj.weight",
  }
  if cfg.qkv_bias:
    names.update(q_bias=pre + "self_attn.q_proj.bias", k_bias=pre + "self_attn.k_proj.bias",
                 v_bias=pre + "self_attn.v_proj.bias")
  if cfg.o_bias:
    names["o_bias"] = pre + "self_attn.o_proj.bias"
  return names


def _to_ours(name: str, w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """HF (torch Linear: [out, in]) -> our einsum layouts."""
  d, n, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  if name == "q_proj":
    return w.T.reshape(d, n, hd)
  if name in ("k_proj", "v_proj"):
    return w.T.reshape(d, k, hd)
  if name == "o_proj":
    return w.T.reshape(n, hd, d)
  if name == "q_bias":
    return w.reshape(n, hd)
  if name in ("k_bias", "v_bias"):
    return w.reshape(k, hd)
  if name in ("gate_proj", "up_proj", "down_proj"):
    return w.T
  return w


def _hf_shape(name: str, cfg: ModelConfig) -> Tuple[int, ...]:
  d, f, n, k, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                    cfg.head_dim)
  return {
      "input_layernorm": (d,), "post_attention_layernorm": (d,),
      "q_proj": (n * hd, d), "k_proj": (k * hd, d), "v_proj": (k * hd, d),
      "o_proj": (d, n * hd), "q_bias": (n * hd,), "k_bias": (k * hd,), "v_bias": (k * hd,),
      "o_bias": (d,), "gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f),
  }[name]


def _open_tensors(model_dir: str) -> Dict[str, Tuple[str, Any]]:
  """tensor name -> (file, open safetensors handle) over single or sharded files."""
  from safetensors import safe_open
  single = os.path.join(model_dir, "model.safetensors")
  index = os.path.join(model_dir, "model.safetensors.index.json")
  if os.path.isfile(single):
    files = {"model.safetensors": None}
    weight_map = None
  elif os.path.isfile(index):
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index}: no 'weight_map'")
    files = {f: None for f in sorted(set(weight_map.values()))}
  else:
    raise CheckpointError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
  handles = {}
  for fname in files:
    path = os.path.join(model_dir, fname)
    if not os.path.isfile(path):
      raise CheckpointError(f"{path}: shard named in the index is missing")
    try:
      handles[fname] = safe_open(path, framework="flax")
    except Exception as e:  # noqa: BLE001 - safetensors raises several types
      raise CheckpointError(f"{path}: cannot read safetensors ({e})") from None
  tensors = {}
  for fname, handle in handles.items():
    for name in handle.keys():
      tensors[name] = (fname, handle)
  if weight_map is not None:
    for name, fname in weight_map.items():
      if name not in tensors:
        raise CheckpointError(f"{os.path.join(model_dir, fname)}: tensor {name!r} listed in "
                              "the index is not in the file")
  return tensors


def load_params(model_dir: str, cfg: Optional[ModelConfig] = None):
  """Our fp32 param tree (numpy) from an HF directory; names the bad tensor on error."""
  cfg = cfg or load_model_config(model_dir)
  tensors = _open_tensors(model_dir)
  used = set()

  def get(name: str, shape: Tuple[int, ...]) -> np.ndarray:
    if name not in tensors:
      raise CheckpointError(f"{model_dir}: tensor {name!r} is missing")
    fname, handle = tensors[name]
    w = np.asarray(handle.get_tensor(name).astype("float32"))
    if tuple(w.shape) != tuple(shape):
      raise CheckpointError(f"{os.path.join(model_dir, fname)}: tensor {name!r} has shape "
                            f"{tuple(w.shape)}, expected {tuple(shape)} from config.json")
    used.add(name)
    return w

  layers = {}
  for i in range(cfg.num_layers):
    for ours, hf_name in layer_tensor_names(cfg, i).items():
      layers.setdefault(ours, []).append(_to_ours(ours, get(hf_name, _hf_shape(ours, cfg)), cfg))
  params = {
      "embed_tokens": get("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size)),
      "layers": {k: np.stack(v) for k, v in layers.items()},
      "norm": get("model.norm.weight", (cfg.hidden_size,)),
  }
  if cfg.num_labels:
    params["score_head"] = get("score.weight", (cfg.num_labels, cfg.hidden_size)).T
  elif cfg.tie_word_embeddings:
    used.add("lm_head.weight")  # some tied checkpoints store a copy; it is not used
  else:
    params["lm_head"] = get("lm_head.weight", (cfg.vocab_size, cfg.hidden_size)).T
  unexpected = sorted(n for n in tensors if n not in used and not n.endswith(_IGNORED_SUFFIXES))
  if unexpected:
    raise CheckpointError(f"{model_dir}: unexpected tensor {unexpected[0]!r} "
                          f"({len(unexpected)} unexpected in all) for "
                          f"{_SCORED_NAME[cfg.architecture] if cfg.num_labels else cfg.architecture}")
  return params


def hf_config_dict(cfg: ModelConfig) -> Dict[str, Any]:
  out = {
      "architectures": [cfg.architecture],
      "model_type": SUPPORTED[cfg.architecture],
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "tie_word_embeddings": cfg.tie_word_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings,
      "initializer_range": cfg.initializer_range,
      "bos_token_id": cfg.bos_token_id,
      "eos_token_id": cfg.eos_token_id,
      "pad_token_id": cfg.pad_token_id,
      "dtype": "float32",
      "use_cache": True,
  }
  if cfg.num_labels:
    out["architectures"] = [_SCORED_NAME[cfg.architecture]]
    out["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)}
    out["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_labels)}
  if cfg.architecture == "LlamaForCausalLM":
    out.update(attention_bias=cfg.o_bias, mlp_bias=False)
  else:
    out.update(use_sliding_window=False, sliding_window=None,
               max_window_layers=cfg.num_layers)
    if cfg.o_bias or not cfg.qkv_bias:
      raise ValueError("Qwen2 checkpoints have q/k/v bias and no o bias")
  return out


def to_hf_tensors(params, cfg: ModelConfig) -> Dict[str, np.ndarray]:
  d = cfg.hidden_size
  layers = params["layers"]
  out = {"model.embed_tokens.weight": np.asarray(params["embed_tokens"], np.float32),
         "model.norm.weight": np.asarray(params["norm"], np.float32)}
  for i in range(cfg.num_layers):
    for ours, hf_name in layer_tensor_names(cfg, i).items():
      w = np.asarray(layers[ours][i], np.float32)
      if ours in ("q_proj", "k_proj", "v_proj"):
        w = w.reshape(d, -1).T
      elif ours == "o_proj":
        w = w.reshape(-1, d).T
      elif ours in ("gate_proj", "up_proj", "down_proj"):
        w = w.T
      elif ours.endswith("_bias"):
        w = w.reshape(-1)
      out[hf_name] = np.ascontiguousarray(w)
  if cfg.num_labels:
    out["score.weight"] = np.ascontiguousarray(np.asarray(params["score_head"], np.float32).T)
  elif not cfg.tie_word_embeddings:
    out["lm_head.weight"] = np.ascontiguousarray(np.asarray(params["lm_head"], np.float32).T)
  return out


def save_pretrained(params, cfg: ModelConfig, out_dir: str, tokenizer=None) -> str:
  """Writes an HF directory (fp32 safetensors) that transformers loads as is."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config_dict(cfg), f, indent=2)
  save_file(to_hf_tensors(params, cfg), os.path.join(out_dir, "model.safetensors"),
            metadata={"format": "pt"})
  if tokenizer is not None:
    tokenizer.save_pretrained(out_dir)
  return out_dir


def load_tokenizer(model_dir: str):
  """The HF tokenizer (and its chat template) shipped in `model_dir`, offline."""
  import transformers
  if not any(os.path.isfile(os.path.join(model_dir, f))
             for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
    raise CheckpointError(f"{model_dir}: no tokenizer files (tokenizer.json / vocab.json)")
  return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def critic_params_from_policy(policy_params):
  """The critic starts as the policy's trunk with a zero value head (value 0 everywhere)."""
  trunk = {k: v for k, v in policy_params.items() if k != "lm_head"}
  hidden = np.asarray(policy_params["norm"]).shape[0]
  return {**trunk, "value_head": np.zeros((hidden,), np.float32),
          "value_bias": np.zeros((), np.float32)}
