"""Vocabulary extension (rollx.recipes.vocab) on a copy of the shipped default model."""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from rollx import models
from rollx.models import hf
from rollx.recipes import vocab

TEXTS = (["Instruction: i am looking for gluten free crackers with size: 12 pack",
          "<answer>search[gluten free crackers]</answer>",
          "[B00724] Acorn Classic Gluten Free Crackers | $23.99",
          "<answer>click[gluten free]</answer>"] * 6
         + ["Instruction: i need organic trail mix under 30 dollars"] * 4)


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("vocab") / "model")
  shutil.copytree(models.DEFAULT_MODEL_DIR, out)
  report = vocab.extend_vocabulary(out, TEXTS, max_words=40)
  return out, report


def test_the_frequent_words_become_one_token_in_both_forms(extended):
  out, report = extended
  old, new = hf.load_tokenizer(models.DEFAULT_MODEL_DIR), hf.load_tokenizer(out)
  for word in ("gluten", " gluten", "crackers", " crackers", "Gluten", " Gluten", "looking",
               " looking"):
    assert len(new.encode(word, add_special_tokens=False)) == 1, word
    assert len(old.encode(word, add_special_tokens=False)) > 1, word
  assert report["words"] <= 40 and report["new_tokens"] >= report["words"] // 2
  for word in (" organic", "organic"):  # seen fewer than min_count (5) times: not learnt
    assert len(new.encode(word, add_special_tokens=False)) > 1, word


def test_every_text_decodes_to_itself_and_the_special_tokens_keep_their_ids(extended):
  out, _ = extended
  old, new = hf.load_tokenizer(models.DEFAULT_MODEL_DIR), hf.load_tokenizer(out)
  texts = TEXTS + ["click[b00724] gluten-free, GLUTEN glutenous crackersx ünïcode 日本",
                   "<|im_start|>user\nGo Left<|im_end|>\n<|im_start|>assistant\n"]
  for text in texts:
    ids = new.encode(text, add_special_tokens=False)
    assert new.decode(ids) == text
    assert len(ids) <= len(old.encode(text, add_special_tokens=False))
  for token in ("<answer>", "</answer>", "<|im_end|>", "<|endoftext|>", "<|im_start|>"):
    assert new.convert_tokens_to_ids(token) == old.convert_tokens_to_ids(token), token
  assert new.eos_token_id == old.eos_token_id and new.pad_token_id == old.pad_token_id
  message = [{"role": "user", "content": "gluten free"}]
  assert new.apply_chat_template(message, tokenize=False) == \
      old.apply_chat_template(message, tokenize=False)


def test_new_embeddings_are_the_mean_of_the_pieces_they_replace(tmp_path):
  out = str(tmp_path / "model")
  shutil.copytree(models.DEFAULT_MODEL_DIR, out)
  report = vocab.extend_vocabulary(out, TEXTS, max_words=40, spread=0.0)
  old_tok, new_tok = hf.load_tokenizer(models.DEFAULT_MODEL_DIR), hf.load_tokenizer(out)
  before = load_file(os.path.join(models.DEFAULT_MODEL_DIR, "model.safetensors"))
  after = load_file(os.path.join(out, "model.safetensors"))
  name = "model.embed_tokens.weight"
  with open(os.path.join(out, "config.json")) as f:
    vocab_size = json.load(f)["vocab_size"]
  assert vocab_size == report["vocab_size"] and vocab_size % 128 == 0
  assert after[name].shape == (vocab_size, before[name].shape[1])
  assert len(new_tok) <= vocab_size
  # the old tokens' rows untouched (the model reads every old token as before); the new
  # tokens take the ids after them, padding rows included
  n = len(old_tok)
  np.testing.assert_array_equal(after[name][:n], before[name][:n])
  for word in (" gluten", "crackers"):
    (token,) = new_tok.encode(word, add_special_tokens=False)
    pieces = old_tok.encode(word, add_special_tokens=False)
    np.testing.assert_allclose(after[name][token], before[name][pieces].mean(axis=0),
                               rtol=1e-6, atol=1e-7)
  assert set(after) == set(before)
  for key in before:
    if key != name:
      np.testing.assert_array_equal(after[key], before[key], err_msg=key)
  models.load_model(out)  # loads as any model


def test_new_embeddings_start_apart_by_noise_of_the_embeddings_spread(extended):
  """Words spelt alike (" gluten" and "gluten": all pieces but the space shared) would start
  nearly equal from their pieces' means; the noise sets them apart, at the old rows' scale."""
  out, _ = extended
  old_tok, new_tok = hf.load_tokenizer(models.DEFAULT_MODEL_DIR), hf.load_tokenizer(out)
  name = "model.embed_tokens.weight"
  before = load_file(os.path.join(models.DEFAULT_MODEL_DIR, "model.safetensors"))[name]
  after = load_file(os.path.join(out, "model.safetensors"))[name]
  new_ids = range(len(old_tok), len(new_tok))
  means = np.stack([before[old_tok.encode(new_tok.decode([i]), add_special_tokens=False)]
                    .mean(axis=0) for i in new_ids])
  noise = after[list(new_ids)] - means
  assert len(new_ids) >= 30
  ratio = noise.std(axis=0) / before.std(axis=0)
  assert 0.75 < ratio.mean() < 1.25 and abs(noise.mean()) < 0.2 * before.std()

  def cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

  spaced, bare = (new_tok.encode(w, add_special_tokens=False)[0] for w in (" gluten", "gluten"))
  at = {i: k for k, i in enumerate(new_ids)}
  alike = cos(means[at[spaced]], means[at[bare]])
  assert alike > 0.9 and cos(after[spaced], after[bare]) < alike - 0.2


def test_a_corpus_with_nothing_frequent_changes_no_tokenization(tmp_path):
  out = str(tmp_path / "model")
  shutil.copytree(models.DEFAULT_MODEL_DIR, out)
  report = vocab.extend_vocabulary(out, ["a rare sentence"], max_words=10)
  assert report["words"] == 0 and report["new_tokens"] == 0
  text = "Instruction: i am looking for gluten free crackers"
  assert hf.load_tokenizer(out).encode(text) == \
      hf.load_tokenizer(models.DEFAULT_MODEL_DIR).encode(text)


def test_an_untied_head_grows_as_the_embeddings_do(tmp_path):
  import dataclasses
  out = str(tmp_path / "untied")
  shutil.copytree(models.DEFAULT_MODEL_DIR, out)
  cfg = hf.load_model_config(out)
  params = hf.load_params(out, cfg)
  head = np.asarray(params["embed_tokens"]).T * 0.5 + 0.01
  hf.save_pretrained(dict(params, lm_head=head), dataclasses.replace(cfg, tie_word_embeddings=False),
                     out)
  vocab.extend_vocabulary(out, TEXTS, max_words=40, spread=0.0)
  after = models.load_model(out).params
  (token,) = hf.load_tokenizer(out).encode(" gluten", add_special_tokens=False)
  pieces = hf.load_tokenizer(models.DEFAULT_MODEL_DIR).encode(" gluten", add_special_tokens=False)
  np.testing.assert_allclose(np.asarray(after["lm_head"])[:, token], head[:, pieces].mean(axis=1),
                             rtol=1e-6, atol=1e-7)
  n = len(hf.load_tokenizer(models.DEFAULT_MODEL_DIR))
  np.testing.assert_array_equal(np.asarray(after["lm_head"])[:, :n], head[:, :n])


def test_a_negative_spread_is_refused_by_name(tmp_path):
  with pytest.raises(ValueError, match="spread must be >= 0"):
    vocab.extend_vocabulary(str(tmp_path), TEXTS, spread=-1.0)


def test_a_model_without_a_bpe_tokenizer_file_is_refused_by_name(tmp_path):
  out = str(tmp_path / "model")
  shutil.copytree(models.DEFAULT_MODEL_DIR, out)
  path = os.path.join(out, "tokenizer.json")
  with open(path) as f:
    state = json.load(f)
  state["model"]["type"] = "WordPiece"
  with open(path, "w") as f:
    json.dump(state, f)
  with pytest.raises(ValueError, match="tokenizer.json: model type 'WordPiece'"):
    vocab.extend_vocabulary(out, TEXTS)
  os.remove(path)
  with pytest.raises(ValueError, match="tokenizer.json: no such file"):
    vocab.extend_vocabulary(out, TEXTS)
