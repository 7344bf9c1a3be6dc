"""The shipped default model directory: offline, HF-format, covers the env prompts."""

import jax.numpy as jnp
import numpy as np
import torch
import transformers

import envs
from envs import sokoban
from rollx import models
from rollx.models import hf, llm, make_default
from rollx.rollout import prompts


def test_default_dir_loads_through_the_hf_path_offline():
  loaded = models.load_model(None)
  assert loaded.model_dir == models.DEFAULT_MODEL_DIR
  assert 1e6 < loaded.config.num_params < 10e6
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  assert len(tokenizer) <= loaded.config.vocab_size
  assert loaded.config.eos_token_id == tokenizer.eos_token_id
  ref = transformers.AutoModelForCausalLM.from_pretrained(models.DEFAULT_MODEL_DIR,
                                                          local_files_only=True).eval()
  ids = np.random.default_rng(0).integers(0, len(tokenizer), (2, 40))
  with torch.no_grad():
    expected = ref(torch.tensor(ids)).logits.numpy()
  got = np.asarray(llm.forward(loaded.model, loaded.params, jnp.asarray(ids)))
  assert np.abs(got - expected).max() / np.abs(expected).max() < 1e-5


def test_tokenizer_covers_env_prompts_and_chat_template():
  tokenizer = hf.load_tokenizer(models.DEFAULT_MODEL_DIR)
  for env_type, cfg in [("FrozenLake", {})] + [("Sokoban", v) for v in sokoban.VARIANTS.values()]:
    env = envs.make_env(env_type, cfg)
    obs, _ = env.reset(seed=123)
    assert tokenizer.decode(tokenizer.encode(obs)) == obs
    for text in (env.instructions, prompts.TURN_TEMPLATE.format(
        turn_idx=3, observation=obs, actions_left=7, max_response_length=8)):
      ids = tokenizer.encode(text)
      assert tokenizer.decode(ids) == text
      assert len(ids) < len(text.encode()) / 2.5  # merges learned on env text
  for action in ("Left", "Down", "Right", "Up"):
    ids = tokenizer.encode(f"<answer>{action}</answer>")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<answer>", action, "</answer>"]
  chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                       add_generation_prompt=True, tokenize=False)
  assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_default_dir_is_reproducible(tmp_path):
  make_default.build(str(tmp_path))
  for name in ("config.json", "tokenizer.json"):
    assert (tmp_path / name).read_text() == open(f"{models.DEFAULT_MODEL_DIR}/{name}").read()
  assert (tmp_path / "model.safetensors").read_bytes() == open(
      f"{models.DEFAULT_MODEL_DIR}/model.safetensors", "rb").read()
