"""A JetStream server for a RollxEngine: rollx's generate loop behind JetStream's gRPC service.

Token ids in, token ids out (`DecodeRequest.token_content` -> one `DecodeResponse`
holding the whole response): a trajectory must be trained on exactly the ids the model
produced, so text never crosses this boundary. The wire protocol is JetStream's
`Orchestrator` service (`Decode`, `HealthCheck`), so JetStream's own clients work; the
requests are batched by rollx.serving.batching's loop over the JetStream Engine API.

What rollx adds to the protocol (JetStream 0.2.2's Decode has no fields for these):
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
- `EndTrajectory` (rollx.Rollout, raw bytes: a trajectory id): the trajectory ended,
  its cached keys/values are dropped (rollx.serving.engine's prefix store);
- `update_params(params, version, abort_in_flight)`: the weights are swapped
  between two generate steps, the port stays open and HealthCheck keeps answering.
  With `abort_in_flight`, requests running at the swap end with gRPC ABORTED
  (ROLL's semantics: the client resubmits them under the new weights).

The response is sent in one message when the request completes, not a message per
token: the env acts only on the whole response, and with ~5-token answers at hundreds
of requests/s the per-token messages and event-loop wake-ups were a large part of the
server process's time under the GIL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from concurrent import futures
from typing import Dict, Optional, Sequence

import grpc
import ml_collections
import numpy as np

from rollx import models
from rollx.errors import ConfigError
from rollx.models import hf, lora
from rollx.parallel import mesh as mesh_lib
from rollx.serving import (BEHAVIOUR_LOGP_KEY, END_TRAJECTORY_METHOD, PREFILL_VERSION_KEY,
                           REQUEST_ID_KEY, SAMPLING_KEY, SAMPLING_PARAMS_KEY, TRAJECTORY_KEY,
                           VERSIONS_KEY)
from rollx.serving.batching import GenerateLoop, GenerateLoopDied, Request
from rollx.serving.engine import RollxEngine, Sampling
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc  # noqa: E402


def _resolve(ended: Sequence[Request]) -> None:
  """On the server's event loop: wakes the Decode coroutines of requests that ended."""
  for r in ended:
    if not r.handle.done():  # a cancelled RPC's future may be done already
      r.handle.set_result(None)


class RollxOrchestrator(jetstream_pb2_grpc.OrchestratorServicer):

  def __init__(self, engine: RollxEngine, generate: GenerateLoop):
    self._engine, self._generate = engine, generate

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
    active = Request(
        prompt=np.asarray(request.token_content.token_ids, np.int32),
        max_tokens=request.max_tokens, sampling=sampling,
        request_id=metadata.get(REQUEST_ID_KEY, ""),
        trajectory_id=metadata.get(TRAJECTORY_KEY, ""), mode=mode,
        handle=asyncio.get_running_loop().create_future())
    context.add_done_callback(lambda unused: self._generate.cancel(active))
    try:
      self._generate.submit(active)
    except GenerateLoopDied as e:
      await context.abort(grpc.StatusCode.UNAVAILABLE, f"the generate loop died: {e}")
    await active.handle
    if active.error is not None:  # UNAVAILABLE: the client tries another server
      await context.abort(grpc.StatusCode.UNAVAILABLE, f"the generate loop died: {active.error}")
    if active.aborted:
      await context.abort(grpc.StatusCode.ABORTED,
                          "weights were updated while this request ran; resubmit it")
    if active.token_ids:
      yield jetstream_pb2.DecodeResponse(
          stream_content=jetstream_pb2.DecodeResponse.StreamContent(
              samples=[jetstream_pb2.DecodeResponse.StreamContent.Sample(
                  token_ids=active.token_ids)]))
    context.set_trailing_metadata((
        (VERSIONS_KEY, ",".join(map(str, active.token_versions))),
        (PREFILL_VERSION_KEY, str(active.prefill_version)),
        (BEHAVIOUR_LOGP_KEY, np.asarray(active.behaviour_logp, "<f4").tobytes()),
    ))

  async def HealthCheck(self, request, context):
    return jetstream_pb2.HealthCheckResponse(is_live=self._generate.alive)


class RolloutServer:
  """rollx's generate loop over one engine (prefill and generate on the same devices)
  + JetStream's gRPC service."""

  def __init__(self, engine: RollxEngine, host: str = "127.0.0.1", port: int = 0,
               threads: int = 64, detokenize_depth: int = 1):
    self.engine = engine
    self._executor = futures.ThreadPoolExecutor(max_workers=threads)
    self._loop = asyncio.new_event_loop()
    self._loop.set_default_executor(self._executor)
    self.generate_loop = GenerateLoop(engine, self._deliver, depth=detokenize_depth)
    self.servicer = RollxOrchestrator(engine, self.generate_loop)
    self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                    name="rollx-grpc")
    self._thread.start()

    async def start():
      server = grpc.aio.server(self._executor)
      jetstream_pb2_grpc.add_OrchestratorServicer_to_server(self.servicer, server)
      service, method = END_TRAJECTORY_METHOD.strip("/").split("/")
      server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
          method: grpc.unary_unary_rpc_method_handler(self._end_trajectory)}),))
      bound = server.add_insecure_port(f"{host}:{port}")
      if bound == 0:
        raise OSError(f"cannot bind the rollout server to {host}:{port}")
      await server.start()
      return server, bound

    self._server, self.port = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
    self.host = host
    logging.info("rollx rollout server on %s", self.address)

  async def _end_trajectory(self, trajectory_id: bytes, context) -> bytes:
    self.generate_loop.end_trajectory(trajectory_id.decode("utf-8", "replace"))
    return b""

  def _deliver(self, ended: Sequence[Request]) -> None:
    """The generate loop's thread: one wake-up of the event loop per step, not per request."""
    self._loop.call_soon_threadsafe(_resolve, list(ended))

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
            "max_prefix_staleness": float(self.engine.max_prefix_staleness),
            "store_reused_tokens": float(self.engine.store_reused_tokens),
            "stored_tokens": float(self.engine.stored_tokens),
            "store_evictions": float(self.engine.store_evictions)}

  def update_params(self, params, version: int, abort_in_flight: bool = False) -> int:
    """New weights for the next generate step; returns how many requests were aborted."""
    self.engine.update_params(params, version)
    return self.generate_loop.abort_all() if abort_in_flight else 0

  def stop(self) -> None:
    asyncio.run_coroutine_threadsafe(self._server.stop(grace=1), self._loop).result()
    self.generate_loop.stop()
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
  # a restarted server of a LoRA run gets the adapters: they fold into the base it loads
  adapters = params if isinstance(params, lora.AdapterWeights) else None
  engine = RollxEngine(
      loaded.model, loaded.params if params is None or adapters else params, version=version,
      max_concurrent_decodes=s.max_concurrent_decodes, max_prefill_length=s.max_prefill_length,
      max_cache_length=s.max_cache_length, stop_token_ids=sorted(stops),
      sampling={"train": Sampling.from_generating_args(infer.generating_args),
                "val": Sampling.from_generating_args(infer.val_generating_args)},
      hf_tokenizer=tokenizer, pad_id=tokenizer.pad_token_id or 0, mesh=mesh, seed=config.seed,
      reuse_kv=s.reuse_kv, keep_prefix_across_updates=s.keep_prefix_across_updates,
      prefix_cache_tokens=s.prefix_cache_tokens)
  if adapters is not None:
    engine.update_params(adapters, version)
  return engine


def server_from_config(config: ml_collections.ConfigDict, host: str = "127.0.0.1", port: int = 0,
                 params=None, version: int = 0):
  return RolloutServer(engine_from_config(config, params, version), host=host, port=port,
                       detokenize_depth=config.actor_infer.strategy_args.detokenize_depth)
