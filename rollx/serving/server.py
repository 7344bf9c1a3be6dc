"""A JetStream server for a RollxEngine: JetStream's own Driver and gRPC Orchestrator service.

Token ids in, token ids out (`DecodeRequest.token_content` -> a `DecodeResponse`
stream, one message holding the whole response: see ResponseChannel): a trajectory
must be trained on exactly the ids the model produced, so text never crosses this
boundary.

What rollx adds around JetStream 0.2.2 (whose Decode has no fields for these):
- request checks before anything is queued (empty prompt, id out of vocab, prompt
  longer than the prefill buckets or the cache): gRPC INVALID_ARGUMENT, and the
  server keeps serving;
- sampling mode per request from the invocation metadata `rollx-sampling`
  (`train`: actor_infer.generating_args; `val`: validation sampling; default train),
  so train and validation requests share one batch;
- the policy version of every returned token, in the trailing metadata
  `rollx-policy-versions` (comma-separated, one per token), and its behaviour
  log-prob (the log-prob under the distribution it was sampled from) in
  `rollx-behaviour-logp-bin` (float32 bytes);
- `update_params(params, version, abort_in_flight)`: the weights are swapped
  between two generate steps, the port stays open and HealthCheck keeps answering.
  With `abort_in_flight`, requests running at the swap end with gRPC ABORTED
  (ROLL's semantics: the client resubmits them under the new weights).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
from concurrent import futures
from typing import Dict, Optional

import grpc
import ml_collections
import numpy as np

from rollx import models
from rollx.errors import ConfigError
from rollx.models import hf
from rollx.parallel import mesh as mesh_lib
from rollx.serving import (BEHAVIOUR_LOGP_KEY, PREFILL_VERSION_KEY, REQUEST_ID_KEY,
                           SAMPLING_KEY, SAMPLING_PARAMS_KEY, TRAJECTORY_KEY, VERSIONS_KEY,
                           compat)
from rollx.serving.engine import RollxEngine, Sampling

compat.apply()
from jetstream.core import orchestrator  # noqa: E402
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc  # noqa: E402

# JetStream prepends BOS unless the request names a session cache; rollx prompts
# are complete token sequences, so every request is marked this way.
_NO_BOS = "rollx:no-bos"


@dataclasses.dataclass
class RollxRequest(orchestrator.ActiveRequest):
  """An ActiveRequest that carries its sampling mode; the engine records on it the step
  and the weights version that prefilled it.

  JetStream's engine API passes `insert` only the prefill result, so the request
  attaches itself to its Prefix when the prefill thread stores it here.
  """
  request_id: str = ""
  sampling: Optional[Sampling] = None
  prefill_version: Optional[int] = None
  first_step: Optional[int] = None  # the engine's generate step that makes its first token
  slot: Optional[int] = None  # the decode slot that generates it
  trajectory_id: str = ""  # the conversation it continues ("": none)
  mode: str = ""  # its sampling mode (a key of the engine's `sampling`)
  aborted: bool = False

  def __setattr__(self, name, value):
    if name == "prefill_result" and value is not None and hasattr(value, "request"):
      value.request = self
    object.__setattr__(self, name, value)


class ResponseChannel:
  """A request's return channel: what JetStream's detokenize thread writes each step's
  samples to (the part of 0.2.2's `AsyncMultifuture` its threads use: add_result,
  close; Decode registers cancel), delivered to the Decode coroutine once, when the
  request completes.

  0.2.2's channel wakes the server's event loop for every token (a cross-thread call
  per add_result) and its Decode sends a gRPC message per token. The env acts only on
  the whole response, so rollx buffers the steps and sends one message: with ~5-token
  answers at a few hundred requests/s, the per-token wake-ups and messages were a
  large part of the server process's time under the GIL.
  """

  def __init__(self) -> None:
    self._loop = asyncio.get_running_loop()
    self._steps: list = []  # per generate step: [ReturnSample]
    self._finished = self._loop.create_future()

  # -- the detokenize thread's side --------------------------------------------------
  def add_result(self, samples) -> None:
    self._steps.append(samples)  # list.append is atomic; read only after close()

  def close(self) -> None:
    self._finish(None)

  # -- the gRPC side -------------------------------------------------------------------
  def cancel(self, unused=None) -> None:
    """The RPC ended (add_done_callback: also after a normal finish, then a no-op)."""
    del unused
    self._finish(asyncio.CancelledError())

  async def token_ids(self) -> list:
    """Every generated id, in order, once the request is complete."""
    await self._finished
    return [t for samples in self._steps for t in samples[0].token_ids]

  def _finish(self, error) -> None:
    def resolve():
      if self._finished.done():
        return
      if error is None:
        self._finished.set_result(None)
      else:
        self._finished.set_exception(error)
    self._loop.call_soon_threadsafe(resolve)


class RollxOrchestrator(jetstream_pb2_grpc.OrchestratorServicer):

  def __init__(self, driver: orchestrator.Driver, engine: RollxEngine):
    self._driver, self._engine = driver, engine
    self.in_flight: Dict[int, RollxRequest] = {}

  def _check(self, request) -> Optional[str]:
    """Why `request` cannot be served, or None."""
    if request.WhichOneof("content") != "token_content":
      return "send token ids (token_content); rollx serves no text_content"
    ids = request.token_content.token_ids
    engine = self._engine
    if len(ids) == 0:
      return "token_content.token_ids is empty"
    vocab = engine.config.vocab_size
    bad = next((i for i, t in enumerate(ids) if t < 0 or t >= vocab), None)
    if bad is not None:
      return f"token_content.token_ids[{bad}]={ids[bad]} is outside the vocabulary [0, {vocab})"
    if len(ids) > engine.max_prefill_length:
      return (f"token_content.token_ids has {len(ids)} tokens; the server's "
              f"max_prefill_length is {engine.max_prefill_length}")
    if request.max_tokens < 1:
      return f"max_tokens={request.max_tokens} must be >= 1"
    if len(ids) + request.max_tokens > engine.max_cache_length:
      return (f"prompt of {len(ids)} tokens + max_tokens={request.max_tokens} exceeds the "
              f"server's max_cache_length={engine.max_cache_length}")
    return None

  async def Decode(self, request: jetstream_pb2.DecodeRequest,
                   context: grpc.aio.ServicerContext):
    problem = self._check(request)
    metadata = dict(context.invocation_metadata() or ())
    mode = metadata.get(SAMPLING_KEY, "train")
    if problem is None and mode not in self._engine.sampling:
      problem = f"metadata {SAMPLING_KEY}={mode!r} is not one of {sorted(self._engine.sampling)}"
    sampling = None
    if problem is None:
      sampling, problem = _sampling_of(self._engine.sampling[mode],
                                       metadata.get(SAMPLING_PARAMS_KEY))
    if problem is not None:
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
    channel = ResponseChannel()
    context.add_done_callback(channel.cancel)
    active = RollxRequest(
        max_tokens=request.max_tokens, return_channel=channel, history_path=_NO_BOS,
        # An ndarray, not the list 0.2.2's own Decode passes: its pad_tokens reads
        # `.shape`, so a list of token ids kills the prefill thread.
        prefill_content=np.asarray(request.token_content.token_ids, np.int32),
        is_client_side_tokenization=True, request_id=metadata.get(REQUEST_ID_KEY, ""),
        sampling=sampling, trajectory_id=metadata.get(TRAJECTORY_KEY, ""),
        mode=mode)
    try:
      self._driver.place_request_on_prefill_queue(active)
    except queue.Full:
      await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "prefill queue full; retry")
    self.in_flight[id(active)] = active
    try:
      ids = await channel.token_ids()
    finally:
      self.in_flight.pop(id(active), None)
    if not active.aborted:  # before the response: the next turn may continue from it
      self._engine.finish(active, ids)
    num_tokens = len(ids)
    if ids:
      yield jetstream_pb2.DecodeResponse(
          stream_content=jetstream_pb2.DecodeResponse.StreamContent(
              samples=[jetstream_pb2.DecodeResponse.StreamContent.Sample(token_ids=ids)]))
    versions = self._engine.versions_of(active.first_step, num_tokens)
    try:
      logp = self._engine.behaviour_logp_of(active.slot, active.first_step, num_tokens)
    except LookupError as e:  # far behind the generate loop: the client resubmits
      logging.error("request %s: %s", active.request_id, e)
      await context.abort(grpc.StatusCode.ABORTED, f"behaviour log-probs lost: {e}")
    context.set_trailing_metadata((
        (VERSIONS_KEY, ",".join(map(str, versions))),
        (PREFILL_VERSION_KEY, str(active.prefill_version)),
        (BEHAVIOUR_LOGP_KEY, logp.astype("<f4").tobytes()),
    ))
    if active.aborted:
      await context.abort(grpc.StatusCode.ABORTED,
                          "weights were updated while this request ran; resubmit it")

  async def HealthCheck(self, request, context):
    return jetstream_pb2.HealthCheckResponse(
        is_live=bool(self._driver.live and not compat.DEAD_THREADS))

  def abort_in_flight(self) -> int:
    """Ends every running request at its next generate step (max_tokens -> 0)."""
    requests = list(self.in_flight.values())
    for r in requests:
      r.aborted = True
      r.max_tokens = 0
    return len(requests)


class RolloutServer:
  """JetStream Driver (interleaved: one engine prefills and generates) + gRPC service."""

  def __init__(self, engine: RollxEngine, host: str = "127.0.0.1", port: int = 0,
               threads: int = 64, detokenize_depth: int = 1):
    self.engine = engine
    self.driver = orchestrator.Driver(
        prefill_engines=[engine], generate_engines=[engine],
        prefill_params=[engine.params_holder], generate_params=[engine.params_holder],
        interleaved_mode=True)
    # JetStream lets generate run 8 steps ahead of detokenize; a FrozenLake rollout
    # (~5-token answers, each turn waited on by its env) then spent ~2x the generate steps
    # per turn. One step ahead still overlaps dispatch with the previous step's tokens
    # (bench/serve.py --workload rollout compares depths).
    compat.set_detokenize_depth(self.driver, detokenize_depth)
    # a finished turn's slot keeps its keys/values for the trajectory's next turn
    compat.reuse_slots_least_recent_first(self.driver, engine.slot_was_used, engine.slot_for)
    self.servicer = RollxOrchestrator(self.driver, engine)
    self._executor = futures.ThreadPoolExecutor(max_workers=threads)
    self._loop = asyncio.new_event_loop()
    self._loop.set_default_executor(self._executor)
    self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                    name="rollx-grpc")
    self._thread.start()

    async def start():
      server = grpc.aio.server(self._executor)
      jetstream_pb2_grpc.add_OrchestratorServicer_to_server(self.servicer, server)
      bound = server.add_insecure_port(f"{host}:{port}")
      if bound == 0:
        raise OSError(f"cannot bind the rollout server to {host}:{port}")
      await server.start()
      return server, bound

    self._server, self.port = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
    self.host = host
    logging.info("rollx rollout server on %s", self.address)

  @property
  def address(self) -> str:
    return f"{self.host}:{self.port}"

  @property
  def version(self) -> int:
    return self.engine.params_holder.version

  def stats(self) -> Dict[str, float]:
    logp_sum, count = self.engine.sampled_logprob_stats()
    return {"sampled_tokens": float(count), "generate_steps": float(self.engine.num_steps),
            "sampled_logprob_mean": logp_sum / count if count else float("nan"),
            "prefilled_tokens": float(self.engine.prefilled_tokens),
            "reused_tokens": float(self.engine.reused_tokens),
            "stale_reused_tokens": float(self.engine.stale_reused_tokens),
            "max_prefix_staleness": float(self.engine.max_prefix_staleness)}

  def update_params(self, params, version: int, abort_in_flight: bool = False) -> int:
    """New weights for the next generate step; returns how many requests were aborted."""
    self.engine.update_params(params, version)
    return self.servicer.abort_in_flight() if abort_in_flight else 0

  def stop(self) -> None:
    asyncio.run_coroutine_threadsafe(self._server.stop(grace=1), self._loop).result()
    self.driver.stop()
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(timeout=5)


# -- from a config ---------------------------------------------------------------------


def _sampling_of(base: Sampling, params: Optional[str]):
  """(the request's Sampling, None) or (None, what is wrong with `params`)."""
  if not params:
    return base, None
  try:
    temperature, top_p = (float(v) for v in params.split(","))
  except ValueError:
    return None, f"metadata {SAMPLING_PARAMS_KEY}={params!r} is not 'temperature,top_p'"
  if not 0.0 <= temperature <= 100.0 or not 0.0 < top_p <= 1.0:
    return None, (f"metadata {SAMPLING_PARAMS_KEY}={params!r}: temperature must be in "
                  "[0, 100] and top_p in (0, 1]")
  return dataclasses.replace(base, temperature=temperature, top_p=top_p), None


def engine_from_config(config: ml_collections.ConfigDict, params=None, version: int = 0,
                 devices=None):
  """A RollxEngine for `config.actor_infer` (weights from `pretrain` unless given)."""
  infer = config.actor_infer
  loaded = models.load_model(config.pretrain, dtype=infer.model_args.dtype,
                             attention_block=infer.model_args.attention_block)
  tokenizer = hf.load_tokenizer(loaded.model_dir)
  stops = {t for t in (tokenizer.eos_token_id, loaded.config.eos_token_id) if t is not None}
  s = infer.strategy_args
  for key in ("pp_size", "fsdp_size"):
    if s[key] not in (1, -1):
      raise ConfigError([(f"actor_infer.strategy_args.{key}",
                          "a rollout server shards over tensor only (set 1); replicas are "
                          "separate servers (num_servers)")])
  # One server is one model replica: its mesh is tp_size devices (of device_mapping).
  tp = s.tp_size if s.tp_size != -1 else len(mesh_lib.role_devices(
      infer.device_mapping, "actor_infer", devices))
  server_devices = mesh_lib.role_devices(infer.device_mapping, "actor_infer", devices)[:tp]
  mesh = mesh_lib.make_mesh(dict(dp_size=1, fsdp_size=1, pp_size=1, tp_size=tp),
                            role="actor_infer", devices=server_devices)
  return RollxEngine(
      loaded.model, loaded.params if params is None else params, version=version,
      max_concurrent_decodes=s.max_concurrent_decodes, max_prefill_length=s.max_prefill_length,
      max_cache_length=s.max_cache_length, stop_token_ids=sorted(stops),
      sampling={"train": Sampling.from_generating_args(infer.generating_args),
                "val": Sampling.from_generating_args(infer.val_generating_args)},
      hf_tokenizer=tokenizer, pad_id=tokenizer.pad_token_id or 0, mesh=mesh, seed=config.seed,
      reuse_kv=s.reuse_kv, keep_prefix_across_updates=s.keep_prefix_across_updates)


def server_from_config(config: ml_collections.ConfigDict, host: str = "127.0.0.1", port: int = 0,
                 params=None, version: int = 0):
  return RolloutServer(engine_from_config(config, params, version), host=host, port=port,
                       detokenize_depth=config.actor_infer.strategy_args.detokenize_depth)
