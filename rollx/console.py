"""Console hygiene: native records that libraries write straight to file descriptor 2.

Python's logging can be set per logger (rollx.cli.quiet_console), but Ray's C++ code
writes to fd 2 directly. `native_stderr_filtered(pattern)` sends fd 2 to a
temporary file for the length of a `with` block and then writes back every line that
`pattern` does not match, so only the known notices go and anything else (an error
the block did not expect) still shows, after the block. With absl's --verbosity=0
(INFO) nothing is filtered.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile


def verbose() -> bool:
  """Whether absl's verbosity asks for INFO records (--verbosity=0 or more)."""
  from absl import logging as absl_logging
  return absl_logging.get_verbosity() >= absl_logging.INFO


@contextlib.contextmanager
def native_stderr_filtered(pattern: "re.Pattern[str]"):
  """Lines on fd 2 matching `pattern` (re.match) while the block runs are dropped."""
  if verbose():
    yield
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().decode(errors="replace").splitlines(True)
              if not pattern.match(line)]
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()
