"""Tiny random Hugging Face checkpoints saved to a temp dir (torch CPU)."""

import torch
import transformers

VARIANTS = {
    # name: (HF config class, model class, overrides)
    "qwen2_gqa_untied": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "qwen2_gqa_tied": ("Qwen2Config", "Qwen2ForCausalLM",
                       dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "llama_gqa_nobias_untied": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2)),
    "llama_mha_bias_tied": ("LlamaConfig", "LlamaForCausalLM",
                            dict(num_key_value_heads=4, attention_bias=True,
                                 tie_word_embeddings=True, rope_theta=500000.0)),
}


def make_hf_model(tmp_dir, variant="qwen2_gqa_untied", seed=0, head="CausalLM", **extra):
  """`head="SequenceClassification"`: the variant's trunk with a `score` head (a reward
  model as AutoModelForSequenceClassification writes it; `num_labels=` in `extra`)."""
  cfg_cls, model_cls, overrides = VARIANTS[variant]
  model_cls = model_cls.replace("CausalLM", head)
  kwargs = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, max_position_embeddings=256, rms_norm_eps=1e-6,
                eos_token_id=100, bos_token_id=None, pad_token_id=0)
  kwargs.update(overrides, **extra)
  rope_theta = kwargs.pop("rope_theta", 10000.0)
  config = getattr(transformers, cfg_cls)(**kwargs)
  config.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
  torch.manual_seed(seed)
  model = getattr(transformers, model_cls)(config)
  with torch.no_grad():  # larger than HF's init so that errors would show
    for p in model.parameters():
      p.normal_(0.0, 0.1)
  model.eval()
  path = str(tmp_dir / (variant if head == "CausalLM" else f"{variant}_{head}"))
  model.save_pretrained(path)
  return model, path


def default_trunk_reward_model(out, seed=0):
  """A reward model reading the shipped default's tokens: its trunk and a random `score`
  head, written as a sequence-classification directory."""
  import dataclasses
  import numpy as np
  from rollx import models
  from rollx.models import hf
  cfg = hf.load_model_config(models.DEFAULT_MODEL_DIR)
  params = hf.load_params(models.DEFAULT_MODEL_DIR, cfg)
  params.pop("lm_head", None)
  params["score_head"] = np.random.default_rng(seed).normal(
      0.0, 1.0, (cfg.hidden_size, 1)).astype(np.float32)
  return hf.save_pretrained(params, dataclasses.replace(cfg, num_labels=1), str(out))
