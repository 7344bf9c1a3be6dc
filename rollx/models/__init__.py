"""Policy and critic models: the Flax decoder (`llm`), HF interop (`hf`), log-probs."""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import jax.numpy as jnp

from rollx.models import hf, llm

DEFAULT_MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default")
# The default model copy pretrained, then warm started on tool-use demonstrations (configs/tool_arithmetic.py's
# tools and template; rebuilt by `python -m rollx.recipes.tool_start`)
DEFAULT_TOOLS_MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "default_tools")
# The tool model, the shop's words added to its vocabulary, warm started on WebShop random-play
# pages (configs/webshop.py starts from it;
# rebuilt by `python -m rollx.recipes.webshop_start`)
DEFAULT_WEBSHOP_MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         "default_webshop")


class LoadedModel(NamedTuple):
  model: llm.Transformer
  params: dict
  config: llm.ModelConfig
  model_dir: str


def resolve_model_dir(pretrain: Optional[str]) -> str:
  """`pretrain` unset -> the shipped default directory; else the local HF directory."""
  return DEFAULT_MODEL_DIR if not pretrain else pretrain


def model_name(pretrain: Optional[str]) -> str:
  """The name a server answers to (OpenAI's `model`): the HF directory's name, or
  `rollx-default` for the shipped model."""
  return os.path.basename(os.path.normpath(pretrain)) if pretrain else "rollx-default"


def load_model(pretrain: Optional[str], dtype: str = "fp32", remat: bool = False,
               head: str = "lm", attention_block: int = llm.ATTENTION_BLOCK) -> LoadedModel:
  """The policy (`head='lm'`), critic (`head='value'`, trunk from the policy checkpoint)
  or reward model (`head='score'`, a sequence-classification checkpoint)."""
  model_dir = resolve_model_dir(pretrain)
  config = hf.load_model_config(model_dir)
  if (head == "score") != bool(config.num_labels):
    raise hf.CheckpointError(
        f"{model_dir}: a {'causal LM' if head == 'score' else 'sequence-classification'} "
        f"checkpoint where a {'reward model' if head == 'score' else 'policy or critic'} "
        "is expected (a reward model is an AutoModelForSequenceClassification directory)")
  params = hf.load_params(model_dir, config)
  if head == "value":
    params = hf.critic_params_from_policy(params)
  params = {k: (jnp.asarray(v) if not isinstance(v, dict) else
                {kk: jnp.asarray(vv) for kk, vv in v.items()}) for k, v in params.items()}
  return LoadedModel(llm.make_model(config, dtype, remat, head, attention_block=attention_block),
                     params, config, model_dir)
