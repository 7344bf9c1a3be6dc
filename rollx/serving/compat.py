"""The one place that adapts google-jetstream 0.2.2 to rollx's processes.

rollx uses JetStream's Engine API (`jetstream.engine.engine_api`) and its gRPC protocol;
it does not run JetStream's orchestrator (rollx.serving.batching explains why). The
Engine API module imports `token_utils`, which imports seqio's vocabularies for
SentencePiece text tokenization, and seqio imports TensorFlow: 4 s and ~0.7 GB of RSS in
every process that imports the engine (the servers and the trainer), and TensorFlow's
native start-up writes to fd 2. rollx serves token ids and never tokenizes text in
JetStream, so unless seqio is already loaded, `seqio.vocabularies` is a stand-in module
whose SentencePiece vocabulary says so if anything tries to build one.

`apply()` is idempotent and must run before jetstream's engine modules are imported.
tests/test_tracking.py checks that importing the server loads no TensorFlow.
"""

from __future__ import annotations

import sys
import threading
import types

_APPLIED = False
_lock = threading.Lock()


def apply() -> None:
  global _APPLIED
  with _lock:
    if not _APPLIED:
      _stand_in_for_seqio()
      _APPLIED = True


def _stand_in_for_seqio() -> None:
  """`seqio.vocabularies` as JetStream 0.2.2 imports it, without TensorFlow."""
  if "seqio" in sys.modules:
    return
  vocabularies = types.ModuleType("seqio.vocabularies")

  class Vocabulary:  # what jetstream's mock vocabulary subclasses

    def __init__(self, extra_ids: int = 0):
      self._extra_ids = extra_ids

  class SentencePieceVocabulary(Vocabulary):

    def __init__(self, *args, **kwargs):
      raise NotImplementedError(
          "rollx serves token ids and does not load seqio (rollx.serving.compat): "
          "JetStream's SentencePiece text tokenization is not available")

  vocabularies.Vocabulary, vocabularies.SentencePieceVocabulary = (Vocabulary,
                                                                   SentencePieceVocabulary)
  seqio = types.ModuleType("seqio")
  seqio.__path__, seqio.vocabularies = [], vocabularies
  sys.modules["seqio"], sys.modules["seqio.vocabularies"] = seqio, vocabularies
