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
`<tool_call>` blocks (rollx.tools), `finish_reason` and `usage`. The request fields,
its prompt ids and the reply's reading are rollx/serving/openai_chat.py; this module
is the routes.

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
import hmac
import json
import re
import time
import uuid
from typing import Any, Callable, Dict, Optional

import fastapi
import starlette.exceptions
import uvicorn
from fastapi import responses

from rollx.rollout import recording
from rollx.serving import openai_chat
from rollx.serving.openai_chat import APIError, ChatRequest, EpisodeSettings

MAX_EPISODES = 4096  # recordings kept for episodes nobody closes (rollx.serve), LRU
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


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
      return _error(exc.status, exc.message, exc.param, exc.code, exc.kind)

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
    openai_chat.refuse_unsupported(body)
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
    scratch = rec or recording.EpisodeRecording("", self.tokenizer)
    prompt = openai_chat.prepare(body, scratch, settings)
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
      gen = await self.generate(request_id, prompt.call.prompt_ids, prompt.max_tokens,
                              **kwargs)
    except Exception as e:
      name = type(e).__name__
      if name == "NoServerAliveError":
        raise APIError(503, f"no rollout server is alive: {e}", code="service_unavailable",
                       kind="server_error") from None
      if name == "InvalidRequestError":
        raise APIError(400, str(e)) from None
      raise
    reply = openai_chat.read_reply(body, prompt, gen, self.tokenizer, self.eos_id)
    if rec is not None:
      rec.commit(prompt.call, reply.ids, reply.versions, reply.logp, reply.raw, reply.message,
                 reply.stopped)
    logprobs = openai_chat.logprobs(self.tokenizer, self.eos_id, reply.ids, reply.logp) \
        if body.logprobs else None
    return reply.message, reply.usage, reply.finish, logprobs


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
