"""Vocabulary extension: a model's BPE tokenizer learns the frequent words of a new domain.

    extend_vocabulary(model_dir, texts, max_words=600)

A tokenizer trained on other text cuts a new domain's words into many pieces (the default
tokenizer: "gluten free snack bars" is 19 tokens); a policy that must copy them (a WebShop
search copies the instruction's words) then copies long token strings. This appends BPE
merges that join each chosen word (the most tokens saved: count x (pieces - 1)) into one
token, and gives each new token the mean embedding of the pieces it replaces (as in
vocabulary-transfer work, e.g. Gee et al. 2022, "Fast Vocabulary Transfer"), so the model
starts from what it read before, plus random noise of the embeddings' own spread, so that
words spelt alike start apart (a copy must tell them apart). Merges appended after the
existing ones only apply once those are done: every text the old tokenizer read is still
read the same way up to the new merges, and decoding is unchanged. The tokenizer file is
edited as JSON: the `tokenizers` library trains a BPE from scratch but cannot append
merges to one.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Iterable, List

import numpy as np


def _pieces(tokenizer, pre_token: str) -> List[str]:
  return [t.value for t in tokenizer.backend_tokenizer.model.tokenize(pre_token)]


def word_counts(tokenizer, texts: Iterable[str]) -> collections.Counter:
  """Pre-tokens (the tokenizer's own split: a word with its leading space) and their
  counts over `texts`."""
  pre = tokenizer.backend_tokenizer.pre_tokenizer
  counts = collections.Counter()
  for text in texts:
    counts.update(piece for piece, _ in pre.pre_tokenize_str(text))
  return counts


def choose_words(tokenizer, counts: collections.Counter, max_words: int,
                 min_count: int = 5) -> List[str]:
  """The alphabetic pre-tokens that save the most tokens (count x (pieces - 1)), most
  first (ties by the word: a deterministic order), each with its other form (with and
  without the leading space: a word copied into `search[...]` or `click[...]` follows
  the bracket); `max_words` in all."""
  saved = collections.Counter()
  for word, n in counts.items():
    bare = word[1:] if word.startswith("Ġ") else word  # byte-level's space
    if n >= min_count and bare.isalpha():
      # ranked by its longer form: a word copied after a bracket is the bare form
      saved[bare] += n * (max(len(_pieces(tokenizer, w)) for w in ("Ġ" + bare, bare)) - 1)
  words = []
  for _, bare in sorted((-n, w) for w, n in saved.items() if n):
    words += [w for w in ("Ġ" + bare, bare) if len(_pieces(tokenizer, w)) > 1]
  return words[:max_words]


def _append_merges(tokenizer_json: dict, words: List[str], tokenizer_of) -> List[str]:
  """Appends merges (and their tokens, with the next free ids) so that every word in
  `words` becomes one token: for each word, the chain joining its current pieces left to
  right; repeated until every word is one token (a merge appended for one word can take
  a pair another word's chain needed). Returns the new tokens in id order."""
  model = tokenizer_json["model"]
  vocab = model["vocab"]
  known = {tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]}
  # transformers rebuilds a Qwen2 tokenizer from the vocab and re-adds the added tokens
  # (the answer tags) after it unless the vocab already holds them: with ids past them,
  # it would give them ids of the new words
  for added in tokenizer_json["added_tokens"]:
    vocab.setdefault(added["content"], added["id"])
  next_id = 1 + max(vocab.values())
  new_tokens: List[str] = []
  for _ in range(8):
    tokenizer = tokenizer_of(tokenizer_json)
    pending = [p for w in words if len(p := _pieces(tokenizer, w)) > 1]
    if not pending:
      return new_tokens
    for pieces in pending:
      left = pieces[0]
      for right in pieces[1:]:
        if (left, right) not in known:
          known.add((left, right))
          model["merges"].append([left, right])
          if left + right not in vocab:
            vocab[left + right] = next_id
            new_tokens.append(left + right)
            next_id += 1
        left = left + right
  raise RuntimeError(f"vocabulary extension: {len(pending)} words still split after 8 rounds")


def extend_vocabulary(model_dir: str, texts: Iterable[str], max_words: int = 600,
                      min_count: int = 5, pad_to: int = 128, spread: float = 1.0,
                      seed: int = 0) -> dict:
  """Extends the tokenizer and the (tied or untied) embeddings of the HF model in
  `model_dir` in place with the frequent words of `texts`; returns what it did.

  A new token's embedding (and untied head column) is the mean of its pieces' plus
  Gaussian noise of `spread` times the old rows' per-dimension standard deviation.
  Why the noise: the pieces' mean alone leaves words of one kind nearly equal (colours,
  shoe types: in a WebShop start, after 800 warm-start steps, each new word's nearest new
  word sat at cosine 0.95 on average, "ankle" ~ "running" 0.87, "brown" ~ "pink" 0.83), and
  the policy's copies swapped them ("arch support ankle boots" -> "arch support ... loafers").
  """
  from tokenizers import Tokenizer
  import transformers
  from rollx.models import hf
  if not spread >= 0:
    raise ValueError(f"extend_vocabulary spread must be >= 0 (0: the pieces' mean alone), "
                     f"got {spread}")
  path = os.path.join(model_dir, "tokenizer.json")
  if not os.path.isfile(path):
    raise ValueError(f"{path}: no such file; vocabulary extension edits a tokenizers-library "
                     "BPE tokenizer file")
  with open(path) as f:
    tokenizer_json = json.load(f)
  if tokenizer_json["model"].get("type") != "BPE" or tokenizer_json.get("pre_tokenizer") is None:
    raise ValueError(f"{path}: model type {tokenizer_json['model'].get('type')!r}; vocabulary "
                     "extension needs a BPE model with a pre-tokenizer")
  tokenizer = hf.load_tokenizer(model_dir)
  words = choose_words(tokenizer, word_counts(tokenizer, texts), max_words, min_count)

  def tokenizer_of(state):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)))

  new_tokens = _append_merges(tokenizer_json, words, tokenizer_of)
  vocab = tokenizer_json["model"]["vocab"]
  with open(path, "w") as f:
    json.dump(tokenizer_json, f, ensure_ascii=False)

  cfg = hf.load_model_config(model_dir)
  params = hf.load_params(model_dir, cfg)
  vocab_size = max(cfg.vocab_size, -(-(1 + max(vocab.values())) // pad_to) * pad_to)
  embed = np.asarray(params["embed_tokens"], np.float32)
  grown = np.concatenate([embed, np.zeros((vocab_size - len(embed), embed.shape[1]),
                                          np.float32)])
  head = None if cfg.tie_word_embeddings else np.asarray(params["lm_head"], np.float32)
  if head is not None:  # (hidden, vocab)
    head = np.concatenate([head, np.zeros((head.shape[0], vocab_size - head.shape[1]),
                                          np.float32)], axis=1)
  rng = np.random.default_rng(seed)
  embed_spread = spread * embed.std(axis=0)
  head_spread = None if head is None else spread * head[:, :len(embed)].std(axis=1)
  for token in new_tokens:
    # the old tokenizer's pieces of the same text: what the model used to read for it
    old = [vocab[p] for p in _pieces(tokenizer, token)]
    grown[vocab[token]] = embed[old].mean(axis=0) + rng.normal(0.0, embed_spread)
    if head is not None:
      head[:, vocab[token]] = head[:, old].mean(axis=1) + rng.normal(0.0, head_spread)
  params = dict(params, embed_tokens=grown, **({} if head is None else {"lm_head": head}))
  cfg = dataclasses.replace(cfg, vocab_size=vocab_size)
  hf.save_pretrained(params, cfg, model_dir)
  return {"words": len(words), "new_tokens": len(new_tokens),
          "vocab_size": vocab_size}
