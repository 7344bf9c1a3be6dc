"""An OpenAI-compatible `/v1` endpoint over the rollout servers, recording token-exactly.

    endpoint = OpenAIEndpoint(client.generate, tokenizer, model_name="rollx", ...)
    await endpoint.start()                      # in the caller's event loop
    openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="-")          # not recorded
    openai.AsyncOpenAI(base_url=endpoint.episode_url("ep7"), api_key="-")  # recorded as ep7
    endpoint.close_episode("ep7").samples(reward)  # -> training samples

Serves `GET /v1/models` and `POST /v1/chat/completions` (FastAPI on uvicorn). Each call
renders its messages with the tokenizer's chat template, or extends the episode's
recorded ids (rollx/rollout/recording.py: generated ids verbatim, template ids between),
generates through the rollout client (balancing, sticky sessions, failover, KV reuse)
and returns OpenAI's `chat.completion`: the text, `tool_calls` parsed from Hermes
`<tool_call>` blocks (rollx.tools), `finish_reason` and `usage`.

Which episode a call belongs to: the path (`/episodes/<id>/v1/...`, what agent programs
get as their base URL) or the `X-Episode-Id` header; calls naming neither are served and
not recorded. `GET /episodes/<id>` returns an episode's recording; `DELETE` ends it.

Differences from OpenAI's API, all by design:
- `temperature`, `top_p`, `seed` apply outside training. In training the servers sample
  with `actor_infer.generating_args`, whatever the agent asks, so that the behaviour
  log-probs are those the trainer's policy gradient assumes.
- `stop` cuts the reply after generation (the servers generate to EOS or `max_tokens`);
  the recorded ids end with the token that completed the stop text.
- `stream` sends the whole reply as SSE chunks once it is generated (the servers return
  a response whole).
- `tool_choice`: `none` leaves tool-call text as content; `required` and a named function
  make the reply start with `<tool_call>` (served as prompt ids, mask 0).
- `n` must be 1; any `model` name is accepted (agents hard-code theirs).
- Every other request field is honoured or refused (400 naming it, code
  `unsupported_parameter`): `logprobs` gives each generated token's log-prob under the
  distribution the server sampled it from (not streamed); `top_logprobs` above 0,
  `response_format` other than text, nonzero `presence_penalty` / `frequency_penalty`, a
  `logit_bias` and any field OpenAI's API does not have are refused; `parallel_tool_calls:
  false` keeps the first call; `user` is accepted (a caller's own label).
- A reply cut by `max_tokens` is `finish_reason: "length"` with its text as content, tool
  calls included: an unfinished call is never returned as one. `usage.completion_tokens`
  counts every generated token, those after a stop text too.
- A reply is capped by the context: `max_tokens` beyond what is left of
  `sequence_length` is shortened (finish_reason `length`); a prompt over it is
  `context_length_exceeded`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hmac
import json
import re
import time
import uuid
from typing import Any, Callable, Dict, List, Literal, Optional, Union

import fastapi
import pydantic
import starlette.exceptions
import uvicorn
from fastapi import responses

from rollx.rollout import recording
from rollx.tools import base as tools_base

TOOL_CALL_OPEN = "<tool_call>\n"  # Hermes / Qwen2.5: what a forced tool call starts with
MAX_EPISODES = 4096  # recordings kept for episodes nobody closes (rollx.serve), LRU
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


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
  # accepted only at their neutral values (_unsupported)
  response_format: Optional[Dict[str, Any]] = None
  presence_penalty: Optional[float] = None
  frequency_penalty: Optional[float] = None
  logit_bias: Optional[Dict[str, float]] = None


def _unsupported(body: ChatRequest) -> None:
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


class APIError(Exception):
  """An error answered as OpenAI's error object."""

  def __init__(self, status: int, message: str, param: Optional[str] = None,
               code: Optional[str] = None, kind: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

  def response(self) -> responses.JSONResponse:
    return _error(self.status, self.message, self.param, self.code, self.kind)


def _error(status, message, param=None, code=None, kind="invalid_request_error"):
  return responses.JSONResponse(
      {"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


_TYPE_TAGS = ("str", "int", "float", "bool", "dict", "list", "none")


def _field(loc) -> str:
  """pydantic's error location -> OpenAI's `param` ("messages[1].role")."""
  out = ""
  for part in loc:
    if part == "body":
      continue
    if isinstance(part, int):
      out += f"[{part}]"
    elif (not re.fullmatch(r"[A-Za-z_]\w*", str(part)) or str(part).startswith("_")
          or part in _TYPE_TAGS):
      continue  # a Union member's tag ("str", "list[...]", a model's class name)
    else:
      out += ("." if out else "") + str(part)
  return out


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


class _Guard:
  """ASGI middleware: request body size and the API key, before anything is parsed."""

  def __init__(self, app, max_body_bytes: int, api_key: Optional[str]):
    self.app, self.max_body_bytes, self.api_key = app, max_body_bytes, api_key

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    headers = dict(scope.get("headers") or ())
    if self.api_key is not None:
      auth = headers.get(b"authorization", b"")
      if not hmac.compare_digest(auth, f"Bearer {self.api_key}".encode()):
        return await _error(401, "missing or wrong API key (Authorization: Bearer ...)",
                            code="invalid_api_key")(scope, receive, send)
    length = headers.get(b"content-length")
    too_large = _error(413, f"the request body is over {self.max_body_bytes} bytes",
                       code="request_too_large")
    if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
      return await too_large(scope, receive, send)
    seen = 0

    async def bounded():
      nonlocal seen
      message = await receive()
      seen += len(message.get("body", b""))
      if seen > self.max_body_bytes:
        raise _TooLarge()
      return message

    started = False

    async def tracked(message):
      nonlocal started
      started = started or message["type"] == "http.response.start"
      await send(message)

    try:
      await self.app(scope, bounded, tracked)
    except _TooLarge:
      if not started:
        await too_large(scope, receive, send)


class _TooLarge(Exception):
  pass


class _Server(uvicorn.Server):
  """uvicorn without its signal handlers: the endpoint lives inside a process (a trainer,
  a Ray env worker, rollx.serve) whose signals are its host's business."""

  @contextlib.contextmanager
  def capture_signals(self):
    yield


class OpenAIEndpoint:
  """`/v1/chat/completions` over `generate` (a RolloutClient's signature)."""

  def __init__(self, generate: Callable, tokenizer, *, model_name: str = "rollx",
               settings: Optional[EpisodeSettings] = None, host: str = "127.0.0.1",
               port: int = 0, api_key: Optional[str] = None,
               max_body_bytes: int = 8 << 20, max_concurrent_per_episode: int = 8,
               max_concurrent_requests: int = 1024):
    if host not in LOCAL_HOSTS and not api_key:
      raise ValueError(f"the OpenAI endpoint binds {host}, beyond this machine: give it an "
                       "API key (--openai_api_key or ROLLX_OPENAI_API_KEY)")
    self.generate, self.tokenizer, self.model_name = generate, tokenizer, model_name
    self.settings = settings or EpisodeSettings()
    self.host, self.port, self.api_key = host, port, api_key
    self.max_concurrent_per_episode = max_concurrent_per_episode
    self.max_concurrent_requests = max_concurrent_requests
    self.eos_id = tokenizer.eos_token_id
    self.episodes: "collections.OrderedDict[str, recording.EpisodeRecording]" = \
        collections.OrderedDict()
    self._episode_settings: Dict[str, EpisodeSettings] = {}
    self._in_flight: Dict[str, int] = collections.Counter()
    self._calls = 0
    self._server: Optional[_Server] = None
    self._task: Optional[asyncio.Task] = None
    self._start_lock: Optional[asyncio.Lock] = None
    self.app = self._make_app(max_body_bytes)

  # -- lifecycle -----------------------------------------------------------------------
  @property
  def base_url(self) -> str:
    return f"http://{self._url_host}:{self.port}/v1"

  def episode_url(self, episode_id: str) -> str:
    """The base URL an agent program of `episode_id` is given: its calls are recorded."""
    return f"http://{self._url_host}:{self.port}/episodes/{episode_id}/v1"

  @property
  def _url_host(self) -> str:
    return "127.0.0.1" if self.host in ("0.0.0.0", "::", "localhost") else self.host

  async def start(self) -> "OpenAIEndpoint":
    """Serves in the running event loop (idempotent); returns once the port is bound."""
    self._start_lock = self._start_lock or asyncio.Lock()
    async with self._start_lock:
      if self._task is not None:
        return self
      config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning",
                              lifespan="off", access_log=False)
      self._server = _Server(config)
      self._task = asyncio.ensure_future(self._server.serve())
      while not self._server.started:
        if self._task.done():  # e.g. the port is taken
          self._task.result()
          raise RuntimeError(f"the OpenAI endpoint did not start on {self.host}:{self.port}")
        await asyncio.sleep(0.01)
      self.port = self._server.servers[0].sockets[0].getsockname()[1]
    return self

  async def stop(self) -> None:
    if self._server is not None:
      self._server.should_exit = True
      await self._task
      self._server = self._task = None

  # -- episodes ------------------------------------------------------------------------
  def open_episode(self, episode_id: str, settings: Optional[EpisodeSettings] = None
                   ) -> recording.EpisodeRecording:
    rec = self.episodes[episode_id] = recording.EpisodeRecording(episode_id, self.tokenizer)
    self._episode_settings[episode_id] = settings or self.settings
    while len(self.episodes) > MAX_EPISODES:
      old, _ = self.episodes.popitem(last=False)
      self._episode_settings.pop(old, None)
    return rec

  def close_episode(self, episode_id: str) -> Optional[recording.EpisodeRecording]:
    """The episode's recording, forgotten here (None if it made no call and was not
    opened)."""
    self._episode_settings.pop(episode_id, None)
    return self.episodes.pop(episode_id, None)

  # -- the app ---------------------------------------------------------------------------
  def _make_app(self, max_body_bytes: int):
    app = fastapi.FastAPI(title="rollx OpenAI-compatible endpoint", docs_url=None,
                          redoc_url=None, openapi_url=None)

    @app.exception_handler(fastapi.exceptions.RequestValidationError)
    async def _invalid(request, exc):
      error = exc.errors()[0]
      if error.get("type") == "json_invalid":
        return _error(400, f"the request body is not valid JSON: {error.get('msg', '')}")
      param = _field(error.get("loc", ()))
      if error.get("type") == "extra_forbidden":
        return _error(400, f"{param} is not a field this endpoint knows (OpenAI's Chat "
                      "Completions request fields only)", param, "unsupported_parameter")
      return _error(400, f"{param or 'body'}: {error.get('msg', 'invalid')}", param or None)

    @app.exception_handler(starlette.exceptions.HTTPException)
    async def _route(request, exc):  # unknown routes and methods, as OpenAI answers them
      code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
      what = "no such route" if exc.status_code == 404 else exc.detail
      return _error(exc.status_code, f"{request.method} {request.url.path}: {what}", code=code)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
      return exc.response()

    @app.exception_handler(Exception)
    async def _internal(request, exc):  # the endpoint stays up whatever went wrong
      if isinstance(exc, _TooLarge):  # a body without content-length, over the limit
        return _error(413, f"the request body is over {max_body_bytes} bytes",
                      code="request_too_large")
      return _error(500, f"{type(exc).__name__}: {exc}", kind="server_error")

    @app.get("/v1/models")
    @app.get("/episodes/{episode_id}/v1/models")
    async def models(episode_id: Optional[str] = None):
      return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                          "created": 0, "owned_by": "rollx"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest,
                               x_episode_id: Optional[str] = fastapi.Header(None)):
      return await self._complete(body, x_episode_id)

    @app.post("/episodes/{episode_id}/v1/chat/completions")
    async def episode_chat_completions(episode_id: str, body: ChatRequest):
      return await self._complete(body, episode_id)

    @app.get("/episodes/{episode_id}")
    async def get_episode(episode_id: str):
      rec = self.episodes.get(episode_id)
      if rec is None:
        raise APIError(404, f"no recording of episode {episode_id!r}", "episode_id",
                       "episode_not_found")
      return _recording_json(rec)

    @app.delete("/episodes/{episode_id}")
    async def delete_episode(episode_id: str):
      rec = self.close_episode(episode_id)
      if rec is None:
        raise APIError(404, f"no recording of episode {episode_id!r}", "episode_id",
                       "episode_not_found")
      return _recording_json(rec)

    return _Guard(app, max_body_bytes, self.api_key)

  # -- one call ---------------------------------------------------------------------------
  async def _complete(self, body: ChatRequest, episode_id: Optional[str]):
    # bounds: one episode cannot take the servers, nor all clients the endpoint
    if episode_id and self._in_flight[episode_id] >= self.max_concurrent_per_episode:
      raise APIError(429, f"over {self.max_concurrent_per_episode} concurrent requests for "
                     f"episode {episode_id}", code="rate_limit_exceeded",
                     kind="rate_limit_error")
    if self._in_flight[""] >= self.max_concurrent_requests:
      raise APIError(429, f"over {self.max_concurrent_requests} concurrent requests",
                     code="rate_limit_exceeded", kind="rate_limit_error")
    _unsupported(body)
    keys = ("", episode_id) if episode_id else ("",)
    for key in keys:
      self._in_flight[key] += 1
    try:
      reply, usage, finish, logprobs = await self._generate(body, episode_id)
    finally:
      for key in keys:
        self._in_flight[key] -= 1
        if key and not self._in_flight[key]:
          del self._in_flight[key]  # one entry per episode in flight, not per episode ever
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created, model = int(time.time()), body.model or self.model_name
    if body.stream:
      include_usage = bool((body.stream_options or {}).get("include_usage"))
      return responses.StreamingResponse(
          _sse(completion_id, created, model, reply, finish, usage if include_usage else None),
          media_type="text/event-stream")
    return {"id": completion_id, "object": "chat.completion", "created": created,
            "model": model, "choices": [{"index": 0, "message": reply, "finish_reason": finish,
                                         "logprobs": logprobs}], "usage": usage}

  async def _generate(self, body: ChatRequest, episode_id: Optional[str]):
    settings = self._episode_settings.get(episode_id, self.settings) if episode_id \
        else self.settings
    rec = None
    if episode_id:
      rec = self.episodes.get(episode_id)
      if rec is None:
        rec = self.open_episode(episode_id)
      else:
        self.episodes.move_to_end(episode_id)
    messages = [recording.normalize_message(m.model_dump(exclude_none=True))
                for m in body.messages]
    for m in messages:
      if m["role"] == "developer":  # OpenAI's newer name for the system role
        m["role"] = "system"
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    forced = self._forced(body, tools)
    scratch = rec or recording.EpisodeRecording("", self.tokenizer)
    try:
      call = scratch.prepare(messages, tools, forced)
    except Exception as e:  # a template that cannot render these messages
      raise APIError(400, f"messages: the chat template cannot render them ({e})",
                     "messages") from None
    prompt = call.prompt_ids
    room = settings.sequence_length - len(prompt)
    if room < 1 or len(prompt) > settings.max_prompt_length:
      if rec is not None:
        rec.context_exceeded = True
      raise APIError(400, f"the prompt is {len(prompt)} tokens; this model's context is "
                     f"{settings.sequence_length} tokens (at most "
                     f"{settings.max_prompt_length} prompt tokens) and needs room to reply",
                     "messages", "context_length_exceeded")
    asked = body.max_completion_tokens or body.max_tokens or settings.default_max_tokens or room
    max_tokens = min(asked, room, settings.max_tokens_cap or asked)
    self._calls += 1
    kwargs: Dict[str, Any] = {"mode": settings.mode}
    if rec is not None:
      kwargs["trajectory_id"] = episode_id  # sticky routing and the server's KV reuse
      request_id = f"{episode_id}/c{len(rec.calls)}"
    else:
      request_id = f"openai/{self._calls}"
    if settings.honour_sampling:
      kwargs["sampling"] = (1.0 if body.temperature is None else body.temperature,
                            1.0 if body.top_p is None else body.top_p)
      if body.seed is not None:  # the servers draw a request's tokens from its id
        request_id = f"openai/seed{body.seed}"
    try:
      gen = await self.generate(request_id, prompt, max_tokens, **kwargs)
    except Exception as e:
      name = type(e).__name__
      if name == "NoServerAliveError":
        raise APIError(503, f"no rollout server is alive: {e}", code="service_unavailable",
                       kind="server_error") from None
      if name == "InvalidRequestError":
        raise APIError(400, str(e)) from None
      raise
    ids = list(gen.token_ids)
    generated = len(ids)
    ended = bool(ids) and ids[-1] == self.eos_id
    versions = list(gen.token_versions) or [gen.policy_version] * len(ids)
    logp = list(getattr(gen, "behaviour_logp", None) or ())
    text = self.tokenizer.decode(ids, skip_special_tokens=True)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
    ids, text, stopped = self._cut_at_stop(ids, text, [s for s in stops if s])
    versions, logp = versions[:len(ids)], logp[:len(ids)]
    raw = forced + text
    cut = not (stopped or ended) and generated >= max_tokens
    # a reply cut by max_tokens may end inside a call: its text is the content
    reply, calls = self._reply(raw, body.tool_choice != "none" and bool(tools) and not cut)
    if calls and body.parallel_tool_calls is False:
      reply["tool_calls"] = calls = calls[:1]
    finish = "length" if cut else "tool_calls" if calls else "stop"
    if rec is not None:
      rec.commit(call, ids, versions, logp, raw, reply, stopped)
    usage = {"prompt_tokens": len(prompt), "completion_tokens": generated,
             "total_tokens": len(prompt) + generated}
    return reply, usage, finish, self._logprobs(ids, logp) if body.logprobs else None

  def _logprobs(self, ids: List[int], logp: List[float]) -> Dict[str, Any]:
    """OpenAI's `choices[].logprobs` for the reply's generated tokens (the end-of-turn
    token left out, as it is of the content)."""
    if len(logp) < len(ids) or any(v != v for v in logp[:len(ids)]):
      raise APIError(500, "the rollout server returned no log-probs for this reply",
                     "logprobs", kind="server_error")
    content = []
    for token_id, value in zip(ids, logp):
      if token_id == self.eos_id:
        continue
      token = self.tokenizer.decode([token_id], skip_special_tokens=True)
      content.append({"token": token, "logprob": float(value),
                      "bytes": list(token.encode("utf-8")), "top_logprobs": []})
    return {"content": content, "refusal": None}

  def _forced(self, body: ChatRequest, tools) -> str:
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

  def _cut_at_stop(self, ids: List[int], text: str, stops: List[str]):
    """(ids, text, stopped): the reply up to the earliest stop text (excluded from the
    text); the ids up to the token that completed it."""
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
      return ids, text, False
    at, stop = min(hits)
    for k in range(1, len(ids) + 1):
      if len(self.tokenizer.decode(ids[:k], skip_special_tokens=True)) >= at + len(stop):
        return ids[:k], text[:at], True
    return ids, text[:at], True

  def _reply(self, raw: str, parse_calls: bool):
    """The assistant message for `raw`: well-formed `<tool_call>` blocks become
    `tool_calls` (a malformed one stays in the content, for the agent to see)."""
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
    reply: Dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
      reply["tool_calls"] = calls
    return reply, calls


async def _sse(completion_id, created, model, reply, finish, usage, chunk_chars: int = 32):
  def chunk(delta, finish_reason=None, **extra):
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": [{"index": 0, "delta": delta,
                                         "finish_reason": finish_reason, "logprobs": None}]}
    body.update(extra)
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

  yield chunk({"role": "assistant", "content": ""})
  content = reply.get("content") or ""
  for i in range(0, len(content), chunk_chars):
    yield chunk({"content": content[i:i + chunk_chars]})
  for i, call in enumerate(reply.get("tool_calls") or ()):
    yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                 "function": {"name": call["function"]["name"],
                                              "arguments": ""}}]})
    yield chunk({"tool_calls": [{"index": i, "function": {
        "arguments": call["function"]["arguments"]}}]})
  yield chunk({}, finish)
  if usage is not None:
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": [], "usage": usage}
    yield f"data: {json.dumps(body)}\n\n"
  yield "data: [DONE]\n\n"


def _recording_json(rec: recording.EpisodeRecording) -> Dict[str, Any]:
  def finite(values):
    return [None if v != v else v for v in values]  # NaN is not JSON
  return {"episode_id": rec.episode_id, "breaks": rec.breaks, "calls": [
      {k: (finite(v) if k == "behaviour_logp" else v) for k, v in c.items()} for c in rec.calls],
          "samples": [{"input_ids": s.ids, "response_mask": s.mask, "token_versions": s.versions,
                       "behaviour_logp": finite(s.behaviour)} for s in rec.segments]}
