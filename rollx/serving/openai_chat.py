"""OpenAI's Chat Completions request and reply in token ids, for the endpoint.

The request's fields as OpenAI documents them (pydantic models) and the ones refused;
a request's messages and tools rendered to prompt ids with the chat template (extending
an episode's recording, rollx/rollout/recording.py) and the reply's token budget; the
generated ids read back as OpenAI's assistant message (`tool_calls` parsed from Hermes
`<tool_call>` blocks, rollx.tools), `finish_reason`, `usage` and `logprobs`. The routes
that serve them are rollx/serving/openai_endpoint.py.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, Dict, List, Literal, Optional, Union

import pydantic

from rollx.rollout import recording
from rollx.tools import base as tools_base

TOOL_CALL_OPEN = "<tool_call>\n"  # Hermes / Qwen2.5: what a forced tool call starts with


class APIError(Exception):
  """An error answered as OpenAI's error object."""

  def __init__(self, status: int, message: str, param: Optional[str] = None,
               code: Optional[str] = None, kind: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


@dataclasses.dataclass
class EpisodeSettings:
  """How one episode's calls are served."""
  mode: str = "train"  # the servers' sampling mode ("train" | "val")
  sequence_length: int = 1024  # ids per sample (prompt + every reply)
  max_prompt_length: int = 1024  # the servers' max_prefill_length
  default_max_tokens: Optional[int] = None  # a call's reply when it asks for no limit
  # (None: what is left of the context, as OpenAI's API)
  max_tokens_cap: Optional[int] = None  # a call's reply at most (training: per turn)
  honour_sampling: bool = True  # temperature / top_p / seed from the request


# -- the request, as OpenAI documents it ------------------------------------------------
class _Model(pydantic.BaseModel):
  # a message echoed back from a response may carry fields of no meaning here
  # (`refusal`, `annotations`): ignored. The request itself forbids unknown fields.
  model_config = pydantic.ConfigDict(extra="allow")


class _Function(_Model):
  name: str
  arguments: Union[str, Dict[str, Any]] = "{}"


class _ToolCall(_Model):
  id: Optional[str] = None
  type: Literal["function"] = "function"
  function: _Function


class Message(_Model):
  role: Literal["system", "developer", "user", "assistant", "tool"]
  content: Union[str, List[Dict[str, Any]], None] = None
  name: Optional[str] = None
  tool_calls: Optional[List[_ToolCall]] = None
  tool_call_id: Optional[str] = None


class _FunctionDecl(_Model):
  name: str = pydantic.Field(min_length=1, max_length=64)
  description: str = ""
  parameters: Dict[str, Any] = pydantic.Field(default_factory=dict)


class _ToolDecl(_Model):
  type: Literal["function"] = "function"
  function: _FunctionDecl


class _NamedChoice(_Model):
  type: Literal["function"] = "function"
  function: Dict[Literal["name"], str]


class ChatRequest(_Model):
  model_config = pydantic.ConfigDict(extra="forbid")  # an unknown field is a 400 naming it
  model: str = ""
  messages: List[Message] = pydantic.Field(min_length=1)
  tools: Optional[List[_ToolDecl]] = None
  tool_choice: Union[Literal["auto", "none", "required"], _NamedChoice, None] = None
  temperature: Optional[float] = pydantic.Field(None, ge=0.0, le=2.0)
  top_p: Optional[float] = pydantic.Field(None, gt=0.0, le=1.0)
  max_tokens: Optional[int] = pydantic.Field(None, ge=1)
  max_completion_tokens: Optional[int] = pydantic.Field(None, ge=1)
  stop: Union[str, List[str], None] = None
  seed: Optional[int] = None
  n: Optional[int] = pydantic.Field(None, ge=1, le=1)
  stream: bool = False
  stream_options: Optional[Dict[str, Any]] = None
  logprobs: Optional[bool] = None
  top_logprobs: Optional[int] = pydantic.Field(None, ge=0, le=20)
  parallel_tool_calls: Optional[bool] = None
  user: Optional[str] = None
  # accepted only at their neutral values (refuse_unsupported)
  response_format: Optional[Dict[str, Any]] = None
  presence_penalty: Optional[float] = None
  frequency_penalty: Optional[float] = None
  logit_bias: Optional[Dict[str, float]] = None


def refuse_unsupported(body: ChatRequest) -> None:
  """A 400 for a field the endpoint cannot honour, naming it."""
  refused = None
  if body.response_format not in (None, {"type": "text"}):
    refused = ("response_format", "only {\"type\": \"text\"}: the servers do not constrain "
               "decoding to a format")
  for name in ("presence_penalty", "frequency_penalty"):
    if getattr(body, name) not in (None, 0):
      refused = (name, "the servers sample without penalties")
  if body.logit_bias:
    refused = ("logit_bias", "the servers sample without logit biases")
  if body.top_logprobs:
    refused = ("top_logprobs", "the servers return the sampled token's log-prob only; "
               "ask for logprobs with top_logprobs 0")
  elif body.top_logprobs is not None and not body.logprobs:
    refused = ("top_logprobs", "needs logprobs: true")
  if body.logprobs and body.stream:
    refused = ("logprobs", "not with stream: true (ask without streaming)")
  if refused:
    raise APIError(400, f"{refused[0]} is not supported: {refused[1]}", refused[0],
                   "unsupported_parameter")


# -- request -> prompt ids ----------------------------------------------------------------
@dataclasses.dataclass
class Prompt:
  """What one call serves: its prompt ids (in `call`) and the reply's token budget."""
  call: recording.PreparedCall
  tools: Optional[List[Dict[str, Any]]]  # OpenAI schemas, as the template renders them
  forced: str  # text the reply is made to start with (tool_choice)
  max_tokens: int


def prepare(body: ChatRequest, rec: recording.EpisodeRecording,
            settings: EpisodeSettings) -> Prompt:
  """The prompt for `body`, extending `rec` (a scratch recording when the call is not
  recorded); a prompt over the context marks `rec.context_exceeded` and is a 400."""
  messages = [recording.normalize_message(m.model_dump(exclude_none=True))
              for m in body.messages]
  for m in messages:
    if m["role"] == "developer":  # OpenAI's newer name for the system role
      m["role"] = "system"
  tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
  forced = forced_prefix(body, tools)
  try:
    call = rec.prepare(messages, tools, forced)
  except Exception as e:  # a template that cannot render these messages
    raise APIError(400, f"messages: the chat template cannot render them ({e})",
                   "messages") from None
  prompt = call.prompt_ids
  room = settings.sequence_length - len(prompt)
  if room < 1 or len(prompt) > settings.max_prompt_length:
    rec.context_exceeded = True
    raise APIError(400, f"the prompt is {len(prompt)} tokens; this model's context is "
                   f"{settings.sequence_length} tokens (at most "
                   f"{settings.max_prompt_length} prompt tokens) and needs room to reply",
                   "messages", "context_length_exceeded")
  asked = body.max_completion_tokens or body.max_tokens or settings.default_max_tokens or room
  max_tokens = min(asked, room, settings.max_tokens_cap or asked)
  return Prompt(call, tools, forced, max_tokens)


def forced_prefix(body: ChatRequest, tools) -> str:
  """The reply's forced start for `tool_choice` ("" when the model chooses)."""
  choice = body.tool_choice
  if choice in (None, "auto", "none"):
    return ""
  if not tools:
    raise APIError(400, "tool_choice needs `tools`", "tool_choice")
  if choice == "required":
    return TOOL_CALL_OPEN
  name = choice.function.get("name", "")
  if name not in [t["function"]["name"] for t in tools]:
    raise APIError(400, f"tool_choice names {name!r}, which is not in `tools`", "tool_choice")
  return TOOL_CALL_OPEN + json.dumps({"name": name})[:-1] + ', "arguments": '


# -- generated ids -> OpenAI's reply ------------------------------------------------------
@dataclasses.dataclass
class Reply:
  """One call's reply: as returned (`message`, `finish`, `usage`) and as recorded."""
  message: Dict[str, Any]  # OpenAI's assistant message
  finish: str  # finish_reason
  usage: Dict[str, int]
  ids: List[int]  # the generated ids kept (up to the token completing a stop text)
  versions: List[int]
  logp: List[float]
  raw: str  # the reply's text as generated, forced prefix and tool-call blocks included
  stopped: bool  # cut at a stop text


def read_reply(body: ChatRequest, prompt: Prompt, gen, tokenizer, eos_id: int) -> Reply:
  """`gen` (the servers' generation for `prompt`) as OpenAI's reply to `body`."""
  ids = list(gen.token_ids)
  generated = len(ids)
  ended = bool(ids) and ids[-1] == eos_id
  versions = list(gen.token_versions) or [gen.policy_version] * len(ids)
  logp = list(getattr(gen, "behaviour_logp", None) or ())
  text = tokenizer.decode(ids, skip_special_tokens=True)
  stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
  ids, text, stopped = cut_at_stop(tokenizer, ids, text, [s for s in stops if s])
  versions, logp = versions[:len(ids)], logp[:len(ids)]
  raw = prompt.forced + text
  cut = not (stopped or ended) and generated >= prompt.max_tokens
  # a reply cut by max_tokens may end inside a call: its text is the content
  message, calls = assistant_message(
      raw, body.tool_choice != "none" and bool(prompt.tools) and not cut)
  if calls and body.parallel_tool_calls is False:
    message["tool_calls"] = calls = calls[:1]
  finish = "length" if cut else "tool_calls" if calls else "stop"
  prompt_tokens = len(prompt.call.prompt_ids)
  usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
           "total_tokens": prompt_tokens + generated}
  return Reply(message, finish, usage, ids, versions, logp, raw, stopped)


def cut_at_stop(tokenizer, ids: List[int], text: str, stops: List[str]):
  """(ids, text, stopped): the reply up to the earliest stop text (excluded from the
  text); the ids up to the token that completed it."""
  hits = [(text.find(s), s) for s in stops if s in text]
  if not hits:
    return ids, text, False
  at, stop = min(hits)
  for k in range(1, len(ids) + 1):
    if len(tokenizer.decode(ids[:k], skip_special_tokens=True)) >= at + len(stop):
      return ids[:k], text[:at], True
  return ids, text[:at], True


def assistant_message(raw: str, parse_calls: bool):
  """(message, tool_calls): the assistant message for `raw`: well-formed `<tool_call>`
  blocks become `tool_calls` (a malformed one stays in the content, for the agent to
  see)."""
  calls, content = [], raw
  if parse_calls:
    kept, last = [], 0
    for match in tools_base.TOOL_CALL_BLOCK.finditer(raw[:tools_base.MAX_PARSED_CHARS]):
      parsed = tools_base.parse_tool_calls(match.group(0))
      if parsed and parsed[0].error is None:
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": parsed[0].name,
                                   "arguments": json.dumps(parsed[0].arguments,
                                                           ensure_ascii=False)}})
        kept.append(raw[last:match.start()])
        last = match.end()
    content = "".join(kept) + raw[last:]
    if calls:
      content = content.strip()
  message: Dict[str, Any] = {"role": "assistant", "content": content or None}
  if calls:
    message["tool_calls"] = calls
  return message, calls


def logprobs(tokenizer, eos_id: int, ids: List[int], logp: List[float]) -> Dict[str, Any]:
  """OpenAI's `choices[].logprobs` for the reply's generated tokens (the end-of-turn
  token left out, as it is of the content)."""
  if len(logp) < len(ids) or any(v != v for v in logp[:len(ids)]):
    raise APIError(500, "the rollout server returned no log-probs for this reply",
                   "logprobs", kind="server_error")
  content = []
  for token_id, value in zip(ids, logp):
    if token_id == eos_id:
      continue
    token = tokenizer.decode([token_id], skip_special_tokens=True)
    content.append({"token": token, "logprob": float(value),
                    "bytes": list(token.encode("utf-8")), "top_logprobs": []})
  return {"content": content, "refusal": None}
