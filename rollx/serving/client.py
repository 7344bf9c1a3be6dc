"""The rollout client: `generate` over several JetStream servers, `update_params` to all.

    client = RolloutClient(["127.0.0.1:9000", "127.0.0.1:9001"], weight_targets=servers)
    gen = await client.generate("traj7/turn2", prompt_ids, max_tokens=64, trajectory_id="traj7")
    gen.token_ids, gen.policy_version, gen.behaviour_logp

Routing: a trajectory's turns go to the server that served its first turn (sticky:
the turns share a prefix, and one server sees one policy version sequence);
otherwise the live server with the fewest outstanding requests. A server that
fails (connection refused, stream broken) is marked dead, its sticky
trajectories are re-routed and the request is retried elsewhere from scratch; a
dead server is probed again with HealthCheck after `revive_after_s`. When every
server is dead, a request waits up to `restart_timeout_s` for one to come back
(servers in Ray actors are restarted at the same address, rollx.cluster), probing
each second, then raises NoServerAliveError. ABORTED
(the server's weights changed under an in-flight request, ROLL's abort-at-sync)
is retried. A bad request (INVALID_ARGUMENT) is not retried: it raises.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from typing import Any, List, Optional, Sequence, Tuple

import grpc
import numpy as np

# Only JetStream's generated proto modules: env workers import the client and need
# nothing else of JetStream.
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc

from rollx.serving import (BEHAVIOUR_LOGP_KEY, END_TRAJECTORY_METHOD, PREFILL_VERSION_KEY,
                           REQUEST_ID_KEY, SAMPLING_KEY, SAMPLING_PARAMS_KEY, TRAJECTORY_KEY,
                           VERSIONS_KEY)

MAX_STICKY = 65536  # far more than the trajectories in flight at once
RESTART_POLL_S = 1.0  # how often a request waiting for a restart probes the dead servers
# Failures that mean "this server is gone or broken", as opposed to "this request is bad".
_SERVER_FAILURES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
                    grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)


class NoServerAliveError(RuntimeError):
  """Every rollout server is down; the message lists each with its last error."""


class InvalidRequestError(ValueError):
  """The server rejected the request itself (INVALID_ARGUMENT); details name the field."""


@dataclasses.dataclass
class Generation:
  token_ids: List[int]
  policy_version: int  # the oldest weights that touched the response (prefill included)
  token_versions: List[int]  # version per generated token
  server: str
  # per generated token: its log-prob under the distribution the server sampled it from
  # (temperature, top-k / top-p applied); empty when the generator does not know it
  behaviour_logp: List[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Server:
  address: str
  outstanding: int = 0
  alive: bool = True
  dead_since: float = 0.0
  last_error: str = ""
  channel: Any = None
  stub: Any = None
  loop: Any = None


class RolloutClient:

  def __init__(self, addresses: Sequence[str], *, weight_targets: Sequence[Any] = (),
               max_attempts: Optional[int] = None, timeout_s: float = 600.0,
               revive_after_s: float = 30.0, restart_timeout_s: float = 0.0):
    if not addresses:
      raise ValueError("RolloutClient needs at least one server address")
    self._servers = [_Server(a) for a in addresses]
    # trajectory -> server, least recently used first; bounded so that a long run
    # (one entry per trajectory ever played) does not grow it without end.
    self._sticky: "collections.OrderedDict[str, int]" = collections.OrderedDict()
    self._weight_targets = list(weight_targets)
    self.max_attempts = max_attempts or 2 * len(addresses) + 2
    self.timeout_s, self.revive_after_s = timeout_s, revive_after_s
    self.restart_timeout_s = restart_timeout_s
    self.num_retries = 0  # calls retried: a server failed, or aborted them at a weight push
    self.num_restart_waits = 0  # requests that found every server dead and waited for one

  # -- routing -------------------------------------------------------------------
  def _stub(self, server: _Server):
    loop = asyncio.get_running_loop()
    if server.stub is None or server.loop is not loop:  # channels belong to one event loop
      server.channel = grpc.aio.insecure_channel(server.address)
      server.stub = jetstream_pb2_grpc.OrchestratorStub(server.channel)
      server.loop = loop
    return server.stub

  async def _revive(self, after_s: Optional[float] = None) -> None:
    """HealthCheck the servers dead for longer than `after_s` (default revive_after_s)."""
    now = time.monotonic()
    after_s = self.revive_after_s if after_s is None else after_s
    for s in self._servers:
      if not s.alive and now - s.dead_since >= after_s:
        s.dead_since = now
        try:
          reply = await self._stub(s).HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=2)
          s.alive = bool(reply.is_live)
        except grpc.aio.AioRpcError:
          self._drop_channel(s)

  def _drop_channel(self, s: _Server) -> None:
    """The next call opens a fresh channel: a channel that failed to connect waits out
    gRPC's reconnect backoff (growing to minutes) before it tries a restarted server.
    The old one closes once the calls still on it end (each within timeout_s): closed at
    once, it would cancel them, and a caller sees asyncio.CancelledError, which an env
    loop takes for its own cancellation and ends."""
    if s.channel is not None and s.loop is asyncio.get_running_loop():
      asyncio.ensure_future(s.channel.close(grace=self.timeout_s))
    s.channel = s.stub = None

  async def _pick_or_wait(self, trajectory_id: Optional[str]) -> int:
    """`_pick`, or, with every server dead, wait up to restart_timeout_s for one."""
    deadline = None
    while True:
      try:
        return self._pick(trajectory_id)
      except NoServerAliveError as e:
        now = time.monotonic()
        if deadline is None and self.restart_timeout_s > 0:
          self.num_restart_waits += 1
        deadline = deadline or now + self.restart_timeout_s
        if now >= deadline:
          if self.restart_timeout_s > 0:
            raise NoServerAliveError(f"{e} (waited {self.restart_timeout_s:.0f} s for a "
                                     "restart)") from None
          raise
      await asyncio.sleep(RESTART_POLL_S)
      await self._revive(after_s=RESTART_POLL_S)  # one probe a second, however many wait

  def _pick(self, trajectory_id: Optional[str]) -> int:
    if trajectory_id is not None:
      idx = self._sticky.get(trajectory_id)
      if idx is not None and self._servers[idx].alive:
        self._sticky.move_to_end(trajectory_id)
        return idx
    alive = [i for i, s in enumerate(self._servers) if s.alive]
    if not alive:
      raise NoServerAliveError("no rollout server is alive: " + "; ".join(
          f"{s.address} ({s.last_error or 'dead'})" for s in self._servers))
    idx = min(alive, key=lambda i: self._servers[i].outstanding)
    if trajectory_id is not None:
      self._sticky[trajectory_id] = idx
      if len(self._sticky) > MAX_STICKY:
        self._sticky.popitem(last=False)
    return idx

  def _mark_dead(self, idx: int, error: str) -> None:
    s = self._servers[idx]
    s.alive, s.dead_since, s.last_error = False, time.monotonic(), error
    self._drop_channel(s)
    for t in [t for t, i in self._sticky.items() if i == idx]:
      del self._sticky[t]

  async def end_trajectory(self, trajectory_id: str) -> None:
    """The trajectory ended: its server may drop the keys/values it keeps for it, and its
    stickiness goes. Best effort: a server that does not answer evicts them in time."""
    idx = self._sticky.pop(trajectory_id, None)
    if idx is None or not self._servers[idx].alive:
      return
    server = self._servers[idx]
    self._stub(server)
    try:
      await server.channel.unary_unary(END_TRAJECTORY_METHOD)(trajectory_id.encode(), timeout=10)
    except grpc.aio.AioRpcError:
      pass

  @property
  def alive_servers(self) -> List[str]:
    return [s.address for s in self._servers if s.alive]

  # -- generate --------------------------------------------------------------------
  async def generate(self, request_id: str, prompt_ids: Sequence[int], max_tokens: int, *,
                     trajectory_id: Optional[str] = None, mode: str = "train",
                     sampling: Optional[Tuple[float, float]] = None) -> Generation:
    """`sampling`: (temperature, top_p) instead of the mode's (the mode's top_k kept)."""
    request = jetstream_pb2.DecodeRequest(
        token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=list(prompt_ids)),
        max_tokens=int(max_tokens))
    metadata = ((SAMPLING_KEY, mode), (REQUEST_ID_KEY, request_id)) + (
        ((TRAJECTORY_KEY, trajectory_id),) if trajectory_id is not None else ()) + (
        ((SAMPLING_PARAMS_KEY, f"{sampling[0]!r},{sampling[1]!r}"),) if sampling else ())
    await self._revive()
    for attempt in range(self.max_attempts):
      idx = await self._pick_or_wait(trajectory_id)
      server = self._servers[idx]
      server.outstanding += 1
      try:
        call = self._stub(server).Decode(request, metadata=metadata, timeout=self.timeout_s)
        tokens: List[int] = []
        async for response in call:
          tokens.extend(response.stream_content.samples[0].token_ids)
        trailing = dict(await call.trailing_metadata() or ())
      except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # the caller's own cancellation
          raise
        # the call, not the caller, was cancelled (its channel closed under it): retried
        self.num_retries += 1
        continue
      except grpc.aio.AioRpcError as e:
        code = e.code()
        if code == grpc.StatusCode.INVALID_ARGUMENT:
          raise InvalidRequestError(f"{server.address} rejected request {request_id}: "
                                    f"{e.details()}") from None
        self.num_retries += 1
        if code == grpc.StatusCode.ABORTED:
          continue
        if code in _SERVER_FAILURES:
          self._mark_dead(idx, f"{code.name}: {e.details()}")
          continue
        raise
      finally:
        server.outstanding -= 1
      versions = [int(v) for v in trailing.get(VERSIONS_KEY, "").split(",") if v]
      prefill = trailing.get(PREFILL_VERSION_KEY)
      candidates = versions + ([int(prefill)] if prefill not in (None, "None") else [])
      logp = np.frombuffer(trailing.get(BEHAVIOUR_LOGP_KEY, b""), "<f4").tolist()
      return Generation(tokens, min(candidates) if candidates else -1, versions, server.address,
                        logp)
    raise NoServerAliveError(f"request {request_id} failed {self.max_attempts} times; servers: "
                             + "; ".join(f"{s.address} ({'alive' if s.alive else s.last_error})"
                                         for s in self._servers))

  # -- weights ---------------------------------------------------------------------
  def update_params(self, params, version: int, abort_in_flight: bool = False) -> None:
    """Push new weights to every server this client was given (in-process servers,
    Ray actor handles of `rollx.cluster.ServerActor`, or a `rollx.cluster.ServerGroup`)."""
    pending = []
    for target in self._weight_targets:
      remote = getattr(getattr(target, "update_params", None), "remote", None)
      if remote is not None:
        pending.append(remote(params, version, abort_in_flight))
      else:
        target.update_params(params, version, abort_in_flight)
    if pending:
      import ray
      ray.get(pending)

  async def close(self) -> None:
    for s in self._servers:
      if s.channel is not None:
        await s.channel.close()
        s.channel = s.stub = None
