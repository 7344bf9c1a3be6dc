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
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

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
    return self.tokenizer.apply_chat_template(
        list(messages), tools=self.tools, add_generation_prompt=add_generation_prompt,
        tokenize=False)

  def encode(self, text: str) -> List[int]:
    return list(self.tokenizer.encode(text, add_special_tokens=False))

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
  far. After a response, the template renders the conversation with the new messages;
  that rendering must start with `text` (else the template rewrote what was served:
  TemplateNotAppendOnlyError); what follows is the next ids to serve."""

  def __init__(self, template: ChatTemplate, messages: Sequence[Dict[str, Any]]):
    self.template = template
    self.messages = list(messages)
    self.text = template.render(self.messages, add_generation_prompt=True)

  def prompt_ids(self) -> List[int]:
    return self.template.encode(self.text)

  def extend(self, response_text: str, response_ids: Sequence[int],
             new_messages: Sequence[Dict[str, Any]]) -> List[int]:
    """Template ids between a generated response and the next one.

    `response_text`: the response decoded with special tokens skipped; `response_ids`:
    its ids (an EOS at the end stands for the template's end-of-message text, which is
    then not repeated); `new_messages`: the tool results or user turn that follow."""
    t = self.template
    served = self.text + response_text
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
    return t.encode(after[len(served):])
