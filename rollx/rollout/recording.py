"""An agent program's model calls, recorded token-exactly, -> training samples.

An agent program (LangGraph, the OpenAI SDK, ...) speaks messages to the OpenAI endpoint
(rollx/serving/openai_endpoint.py); the endpoint serves each call from token ids built
here and records what came back:

    call = recording.prepare(messages, tools)      # -> call.prompt_ids (what is served)
    gen = await generate(..., call.prompt_ids, ...)
    reply = recording.commit(call, gen, text)       # -> the assistant message returned
    ...
    samples = recording.samples(reward)             # at episode end

When a call's messages are the previous call's messages plus the reply it got plus new
messages (tool results, a user turn), its prompt ids are the previous prompt ids, the
generated ids verbatim, then the chat template's ids for the new messages
(chat.Conversation.extend): one sample grows, generated ids mask 1, the rest 0. Generated
text is never re-tokenized. Anything else starts a new sample and counts a break by
reason: the agent rewrote history (`rewritten`: summaries, dropped turns, edited
replies), changed its tools (`tools`), the template is not append-only for the new
messages (`template`), the reply was cut at a stop sequence (`stop`: the ids past the cut
were generated but not seen), or two calls of the episode ran at once and the later one
no longer extends the sample (`concurrent`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any, Dict, List, Optional, Sequence

from rollx.rollout import chat
from rollx.rollout.types import Sample

NAN = math.nan
BREAK_REASONS = ("rewritten", "tools", "template", "stop", "concurrent")


def normalize_message(message: Dict[str, Any]) -> Dict[str, Any]:
  """An OpenAI chat message in the one form rollx compares and renders: content a string
  (text parts joined), tool-call arguments parsed from their JSON string, ids dropped
  (agents keep them; chat templates do not render them)."""
  content = message.get("content")
  if isinstance(content, list):
    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
  out: Dict[str, Any] = {"role": message["role"], "content": content or ""}
  if message.get("name"):
    out["name"] = message["name"]
  calls = message.get("tool_calls") or ()
  if calls:
    out["tool_calls"] = [{"type": "function", "function": {
        "name": c["function"]["name"], "arguments": _parsed(c["function"].get("arguments"))}}
                         for c in calls]
  return out


def _parsed(arguments):
  if isinstance(arguments, str):
    try:
      return json.loads(arguments)
    except ValueError:
      return arguments
  return arguments


@dataclasses.dataclass
class Segment:
  """One training sample under construction."""
  ids: List[int] = dataclasses.field(default_factory=list)
  mask: List[int] = dataclasses.field(default_factory=list)
  versions: List[int] = dataclasses.field(default_factory=list)
  behaviour: List[float] = dataclasses.field(default_factory=list)

  def add(self, ids: Sequence[int], generated: bool, versions=None, logp=None) -> None:
    self.ids += ids
    self.mask += [int(generated)] * len(ids)
    self.versions += list(versions) if versions is not None else [-1] * len(ids)
    self.behaviour += list(logp) if logp is not None else [NAN] * len(ids)


@dataclasses.dataclass
class PreparedCall:
  prompt_ids: List[int]  # everything served: the sample so far + template ids (+ forced)
  talk: chat.Conversation  # the conversation as rendered before this call's response
  messages: List[Dict[str, Any]]  # the call's messages, normalized
  tools_key: str
  forced: str = ""  # text the reply is made to start with (tool_choice), served as prompt
  base: Optional[tuple] = None  # (segment index, its length) the call extends; None: new
  follow: List[int] = dataclasses.field(default_factory=list)  # ids after the base
  reason: Optional[str] = None  # why it does not extend the sample (a BREAK_REASONS entry)


@dataclasses.dataclass
class _Last:
  """The last committed call: what the next one must repeat to extend its sample."""
  expected: List[Dict[str, Any]]  # its messages + the reply returned, normalized
  talk: chat.Conversation
  raw_text: str  # the reply as generated (forced prefix included), tool-call blocks and all
  response_ids: List[int]
  tools_key: str
  segment: int
  length: int
  stopped: bool


class EpisodeRecording:
  """The calls of one episode (one agent-program run), in the order they completed."""

  def __init__(self, episode_id: str, tokenizer):
    self.episode_id, self.tokenizer = episode_id, tokenizer
    self.segments: List[Segment] = []
    self.calls: List[Dict[str, Any]] = []
    self.breaks: Dict[str, int] = {r: 0 for r in BREAK_REASONS}
    self.context_exceeded = False  # a call was refused for length: the episode ran out
    self._last: Optional[_Last] = None

  def prepare(self, messages: Sequence[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]],
              forced: str = "") -> PreparedCall:
    """The ids to serve for `messages` (normalized) with `tools` (OpenAI schemas)."""
    messages = list(messages)
    tools_key = json.dumps(tools, sort_keys=True)
    last, reason = self._last, None
    if last is not None:
      n = len(last.expected)
      if last.stopped:
        reason = "stop"
      elif last.tools_key != tools_key:
        reason = "tools"
      elif len(messages) <= n or messages[:n] != last.expected:
        reason = "rewritten"
      else:
        talk = copy.copy(last.talk)
        try:
          follow = talk.extend(last.raw_text, last.response_ids, messages[n:])
        except chat.TemplateNotAppendOnlyError:
          reason = "template"
        else:
          follow += self._encode(forced)
          seg = self.segments[last.segment]
          return PreparedCall(seg.ids[:last.length] + follow, talk, messages, tools_key,
                              forced, (last.segment, last.length), follow)
    talk = chat.ChatTemplate(self.tokenizer, tools).conversation(messages)
    return PreparedCall(talk.prompt_ids() + self._encode(forced), talk, messages, tools_key,
                        forced, None, [], reason)

  def _encode(self, text: str) -> List[int]:
    return chat.encode_text(self.tokenizer, text) if text else []

  def commit(self, call: PreparedCall, response_ids: Sequence[int], versions: Sequence[int],
             behaviour_logp: Sequence[float], raw_text: str, reply: Dict[str, Any],
             stopped: bool = False) -> None:
    """Records the call's response (`raw_text`: forced prefix + generated text; `reply`:
    the assistant message returned, as the agent will send it back)."""
    response_ids = list(response_ids)
    logp = list(behaviour_logp)
    if len(logp) != len(response_ids):
      logp = [NAN] * len(response_ids)
    base = call.base
    if base is not None and (base[0] != len(self.segments) - 1
                             or len(self.segments[base[0]].ids) != base[1]):
      base, call.reason = None, "concurrent"  # another call extended the sample meanwhile
    if base is None:
      if self.segments and call.reason:
        self.breaks[call.reason] += 1
      seg = Segment()
      seg.add(call.prompt_ids, False)
      self.segments.append(seg)
    else:
      seg = self.segments[base[0]]
      seg.add(call.follow, False)
    seg.add(response_ids, True, versions, logp)
    self.calls.append({"prompt_ids": list(call.prompt_ids), "response_ids": response_ids,
                       "policy_versions": list(versions), "behaviour_logp": logp,
                       "segment": len(self.segments) - 1, "response": raw_text, "reply": reply})
    self._last = _Last(call.messages + [normalize_message(reply)], call.talk, raw_text,
                       response_ids, call.tools_key, len(self.segments) - 1, len(seg.ids),
                       stopped)

  def samples(self, reward: float) -> List[Sample]:
    """One training sample per segment that holds generated ids, each with `reward`."""
    return [Sample(list(s.ids), list(s.mask), list(s.versions), float(reward),
                   behaviour_logp=list(s.behaviour)) for s in self.segments if any(s.mask)]
