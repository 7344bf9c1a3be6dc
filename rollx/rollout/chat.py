"""Token-exact multi-turn conversations through a tokenizer's own chat template.

Training ids of a conversation are, in order: the template's ids of the first prompt,
the ids the model generated (verbatim), the template's ids of what follows them (the end
of the assistant message if the model did not end it, the tool results or next user
message, the next generation prompt), the next generated ids, ... Template ids are the
*difference* between two renderings of the conversation, before and after the new
messages, so decode -> re-encode never touches generated ids.

That difference exists only if the template is append-only: rendering more messages
keeps the earlier text as it was. Some templates are not (Qwen3's drops the reasoning of
assistant turns before the last user message); `ChatTemplate.check_append_only` probes a
conversation of the kinds a loop appends and raises `TemplateNotAppendOnlyError` naming
the template and the message kind, at start-up rather than mid-episode.

Outside text is text. Message contents, tool schemas, tool results, env observations and
agent requests may spell a special token (`<|im_end|>\n<|im_start|>user` in a tool's
output); encoded as the control token it would end the turn and open a forged one. Only
the template's own markers and the model's generated ids are control tokens: outside
strings are marked before rendering (`mark_outside_text`) and the rendering is encoded
with the marked spellings as plain text (`encode_rendered`), the scheme of transformers'
`apply_chat_template(..., sanitize_control_tokens=True)`, kept apart in two steps because
a conversation's ids are encoded piece by piece. Text without special-token spellings
encodes exactly as an unmarked rendering. Only special tokens are marked: non-special
added tokens (Qwen's `<think>`, `<tool_call>`) are ordinary vocabulary, and templates
parse them out of assistant contents, which marks would break.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from transformers.utils import chat_template_utils


def mark_outside_text(tokenizer, obj):
  """`obj` (a string, or messages / tools: lists and dicts of strings) with every
  spelling of one of `tokenizer`'s special tokens marked as text."""
  specials = sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special},
                    key=len, reverse=True)  # a token before the tokens it contains
  pattern = re.compile("|".join(map(re.escape, specials)) or "(?!)")
  return chat_template_utils.mark_control_tokens(obj, pattern)


def encode_rendered(tokenizer, text: str) -> List[int]:
  """Ids of `text` rendered from marked outside strings: the template's special tokens
  as themselves, the marked spellings as plain text."""
  return list(tokenizer(text, add_special_tokens=False, sanitize_control_tokens=True)["input_ids"])


def encode_text(tokenizer, text: str) -> List[int]:
  """Ids of an outside string, special-token spellings as plain text."""
  return encode_rendered(tokenizer, mark_outside_text(tokenizer, text))


class TemplateNotAppendOnlyError(ValueError):
  """A chat template that rewrites earlier messages when later ones are added."""


class ChatTemplate:
  """Renders conversations (with `tools`, OpenAI function schemas) with the tokenizer's
  chat template."""

  def __init__(self, tokenizer, tools: Optional[Sequence[Dict[str, Any]]] = None):
    self.tokenizer = tokenizer
    self.tools = list(tools) if tools else None
    self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    self.eos_text = tokenizer.eos_token or ""

  def render(self, messages: Sequence[Dict[str, Any]], add_generation_prompt: bool) -> str:
    """The rendering of `messages`, outside strings marked (see `encode_rendered`)."""
    mark = lambda obj: mark_outside_text(self.tokenizer, obj)
    return self.tokenizer.apply_chat_template(
        mark(list(messages)), tools=mark(self.tools), add_generation_prompt=add_generation_prompt,
        tokenize=False)

  def encode(self, text: str) -> List[int]:
    """Ids of an outside string (a tool result), special-token spellings as plain text."""
    return encode_text(self.tokenizer, text)

  def encode_rendered(self, text: str) -> List[int]:
    return encode_rendered(self.tokenizer, text)

  def conversation(self, messages: Sequence[Dict[str, Any]]) -> "Conversation":
    return Conversation(self, messages)

  def check_append_only(self, kinds: Sequence[str] = ("tool",)) -> None:
    """Raises TemplateNotAppendOnlyError unless appending each message kind in `kinds`
    (tool results, user turns) after assistant turns, with and without reasoning and
    ending with or without EOS, keeps the text served so far."""
    replies = ('<think>\nplan\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n'
               '</tool_call>', 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {}}\n'
               '</tool_call>')
    eos = self.tokenizer.eos_token_id
    for kind in kinds:
      follow = {"role": kind, "content": "R", **({"name": "f"} if kind == "tool" else {})}
      for reply in replies:
        for ids in ([], [eos]):
          talk = self.conversation([{"role": "system", "content": "S"},
                                    {"role": "user", "content": "Q"}])
          talk.extend(reply, ids, [follow])
          talk.extend(reply, ids, [follow])  # multi-step: a second round


class Conversation:
  """One conversation's served text, extended turn by turn.

  `text` is the rendering of everything the model has been served and has generated so
  far, outside strings marked. After a response, the template renders the conversation with the new messages;
  that rendering must start with `text` (else the template rewrote what was served:
  TemplateNotAppendOnlyError); what follows is the next ids to serve."""

  def __init__(self, template: ChatTemplate, messages: Sequence[Dict[str, Any]]):
    self.template = template
    self.messages = list(messages)
    self.text = template.render(self.messages, add_generation_prompt=True)

  def prompt_ids(self) -> List[int]:
    return self.template.encode_rendered(self.text)

  def extend(self, response_text: str, response_ids: Sequence[int],
             new_messages: Sequence[Dict[str, Any]]) -> List[int]:
    """Template ids between a generated response and the next one.

    `response_text`: the response decoded with special tokens skipped; `response_ids`:
    its ids (an EOS at the end stands for the template's end-of-message text, which is
    then not repeated); `new_messages`: the tool results or user turn that follow."""
    t = self.template
    served = self.text + mark_outside_text(t.tokenizer, response_text)  # as rendered
    messages = self.messages + [{"role": "assistant", "content": response_text}] + list(new_messages)
    after = t.render(messages, add_generation_prompt=True)
    ended = bool(response_ids) and response_ids[-1] == t.tokenizer.eos_token_id
    if ended:
      served += t.eos_text
    if not after.startswith(served):
      kinds = "/".join(sorted({m["role"] for m in new_messages}))
      raise TemplateNotAppendOnlyError(
          f"the chat template of {t.name} is not append-only: adding {kinds} messages "
          "rewrites the text already served, so training ids would differ from served ones")
    self.messages, self.text = messages, after
    return t.encode_rendered(after[len(served):])
