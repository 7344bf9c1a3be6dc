"""Turning a model's free-form response into an env action.

The model's output is untrusted text: anything that does not match the configured
pattern, or matches but names no action, is an *invalid action* (the env applies
no move and its format penalty). Parsing never raises on any string.
"""

from __future__ import annotations

import functools
import re
from typing import Optional, Sequence

DEFAULT_ACTION_PATTERN = r"<answer>(.*?)</answer>"

# Responses are capped by max_tokens_per_step upstream, but a parser exposed to
# arbitrary text must bound its own work: a lazy pattern over megabytes of text is
# still linear, but there is no reason to scan past this many characters.
MAX_RESPONSE_CHARS = 65536


@functools.lru_cache(maxsize=64)
def compile_action_pattern(pattern: str) -> re.Pattern:
  """Compiles `pattern` (case-insensitive, dot matches newline); needs one group."""
  try:
    compiled = re.compile(pattern, re.IGNORECASE | re.DOTALL)
  except re.error as e:
    raise ValueError(f"action_pattern {pattern!r} is not a valid regex: {e}") from None
  if compiled.groups < 1:
    raise ValueError(
        f"action_pattern {pattern!r} needs one capture group around the action")
  return compiled


def extract_answer(text, pattern: str = DEFAULT_ACTION_PATTERN) -> Optional[str]:
  """The stripped text of the first `pattern` match in `text` (its capture group), or
  None; non-string input has none. Envs whose actions take arguments parse this."""
  if not isinstance(text, str):
    return None
  match = compile_action_pattern(pattern).search(text[:MAX_RESPONSE_CHARS])
  if match is None or match.group(1) is None:
    return None
  return match.group(1).strip()


def parse_action(text, valid_actions: Sequence[str],
                 pattern: str = DEFAULT_ACTION_PATTERN) -> Optional[str]:
  """Returns the canonical action named in `text`, or None when there is none.

  The first match of `pattern` is taken; its group is stripped and compared to
  `valid_actions` case-insensitively. Non-string input is treated as unparseable.
  """
  answer = extract_answer(text, pattern)
  if answer is None:
    return None
  answer = answer.lower()
  for action in valid_actions:
    if answer == action.lower():
      return action
  return None


def replace_action(text: str, action: str, pattern: str = DEFAULT_ACTION_PATTERN) -> str:
  """`text` with the action its first `pattern` match names replaced by `action`
  (whitespace around it kept); `text` itself when nothing matches."""
  match = compile_action_pattern(pattern).search(text[:MAX_RESPONSE_CHARS])
  if match is None or match.group(1) is None:
    return text
  start, end = match.span(1)
  inner = text[start:end]
  lead = len(inner) - len(inner.lstrip())
  trail = len(inner.rstrip())
  return text[:start] + inner[:lead] + action + inner[trail:] + text[end:]
