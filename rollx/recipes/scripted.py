"""Scripted policies as ordinary checkpoints: a bigram table in Qwen2 weights.

The rollout path (prompt tokens -> JetStream server -> response tokens -> parse ->
env) is tested and benchmarked with a policy whose behaviour is known, served by
the real server. Instead of a fake server, the *model* is scripted: one layer whose
attention and MLP weights are zero (the residual stream is the token embedding),
embeddings that are one-hot, and an output matrix whose row for token `a` puts
equal, large logits on the allowed next tokens. Sampling at temperature 1 then
picks uniformly among them; greedy picks the first.

    ACTION_SCRIPT: any token -> `<answer>`; `<answer>` -> one of the actions;
                   action -> `</answer>`; `</answer>` -> EOS.

So every response is `<answer>{random valid action}</answer><|im_end|>`: a
random valid policy, with the tokenizer of the default model.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from rollx.models import DEFAULT_MODEL_DIR, hf, llm

LOGIT = 30.0  # margin of allowed over disallowed next tokens (after RMSNorm's sqrt(d))


def bigram_policy_dir(out_dir: str, transitions: Dict[str, Sequence[str]],
                      default_next: Sequence[str], tokenizer_dir: str = DEFAULT_MODEL_DIR) -> str:
  """Writes an HF directory whose greedy/sampled continuation follows `transitions`
  (token string -> allowed next tokens); other tokens go to `default_next`."""
  tokenizer = hf.load_tokenizer(tokenizer_dir)
  vocab = -(-len(tokenizer) // 128) * 128
  ids = lambda toks: [tokenizer.convert_tokens_to_ids(t) for t in toks]
  cfg = llm.ModelConfig(
      vocab_size=vocab, hidden_size=vocab, intermediate_size=8, num_layers=1, num_heads=1,
      num_kv_heads=1, head_dim=8, tie_word_embeddings=False, qkv_bias=True,
      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
  table = np.zeros((vocab, vocab), np.float32)  # [current, next]
  scale = LOGIT / np.sqrt(vocab)  # the final RMSNorm scales a one-hot row by sqrt(d)
  table[:, ids(default_next)] = scale
  for token, nexts in transitions.items():
    (row,) = ids([token])
    table[row] = 0.0
    table[row, ids(nexts)] = scale
  zeros = lambda *shape: np.zeros(shape, np.float32)
  layers = {
      "input_layernorm": np.ones((1, vocab), np.float32),
      "post_attention_layernorm": np.ones((1, vocab), np.float32),
      "q_proj": zeros(1, vocab, 1, 8), "k_proj": zeros(1, vocab, 1, 8),
      "v_proj": zeros(1, vocab, 1, 8), "o_proj": zeros(1, 1, 8, vocab),
      "q_bias": zeros(1, 1, 8), "k_bias": zeros(1, 1, 8), "v_bias": zeros(1, 1, 8),
      "gate_proj": zeros(1, vocab, 8), "up_proj": zeros(1, vocab, 8),
      "down_proj": zeros(1, 8, vocab),
  }
  params = {"embed_tokens": np.eye(vocab, dtype=np.float32), "layers": layers,
            "norm": np.ones((vocab,), np.float32), "lm_head": table}
  return hf.save_pretrained(params, cfg, out_dir, tokenizer=tokenizer)


def random_action_policy_dir(out_dir: str, actions: Sequence[str] = ("Left", "Down", "Right", "Up"),
                             tokenizer_dir: Optional[str] = None) -> str:
  """`<answer>{uniform action}</answer><|im_end|>` after any prompt."""
  tokenizer_dir = tokenizer_dir or DEFAULT_MODEL_DIR
  eos = hf.load_tokenizer(tokenizer_dir).eos_token
  transitions = {"<answer>": list(actions), "</answer>": [eos]}
  transitions.update({a: ["</answer>"] for a in actions})
  return bigram_policy_dir(out_dir, transitions, ["<answer>"], tokenizer_dir)
