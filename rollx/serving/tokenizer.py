"""The tokenizer JetStream's Engine API asks an engine for (`build_tokenizer`): rollx's
servers take token ids, so this one only pads and, for text requests and logging, goes
through the HF tokenizer."""

from __future__ import annotations

import numpy as np

from rollx.serving import compat

compat.apply()
from jetstream.engine import tokenizer_api  # noqa: E402


class TokenIdsTokenizer(tokenizer_api.Tokenizer):
  """What JetStream's Engine API asks of a tokenizer, for token-id requests.

  Stops are the engine's job (see `RollxEngine`), so `stop_tokens` is empty.
  `encode`/`decode` go through the HF tokenizer for text requests and logging.
  """

  def __init__(self, hf_tokenizer, pad_id: int):
    self._tok, self._pad = hf_tokenizer, pad_id

  def encode(self, s: str, **kwargs):
    from jetstream.engine import token_utils
    # a text request is outside text: no special token it spells is a control token
    ids = np.asarray(self._tok.encode(s, split_special_tokens=True), np.int32)
    return token_utils.pad_tokens(ids, self.bos_id, self.pad_id, is_bos=False,
                                  max_prefill_length=kwargs.get("max_prefill_length"),
                                  jax_padding=kwargs.get("jax_padding", True))

  def decode(self, token_ids: list[int], **kwargs) -> str:
    return self._tok.decode(token_ids) if self._tok is not None else ""

  @property
  def pad_id(self) -> int:
    return self._pad

  @property
  def eos_id(self) -> int:
    return self._pad

  @property
  def bos_id(self) -> int:
    return self._pad

  @property
  def stop_tokens(self) -> set[int]:
    return set()
