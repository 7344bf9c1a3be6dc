"""All of rollx's Ray wiring: the local cluster, and the actors of every role.

    owns_ray = init_ray(config)                        # a local Ray, or join config.ray_address
    servers = start_servers(config)                    # actor_infer: JetStream servers
    rollout = start_rollout(config, "train_env_manager", servers.addresses)  # scheduler + env workers
    batch, metrics = rollout.get_batch(config.rollout_batch_size)
    rollout.set_version(step)                          # after each weight sync
    rollout.stop(); servers.stop(); shutdown_ray(owns_ray)

Env workers are CPU-only async actors, each hosting up to `max_env_num_per_worker`
env managers whose rollout loops run as asyncio tasks (a slow env holds up nobody).
The workers talk to the scheduler actor (tickets, trajectories) and to the servers
(gRPC) directly. A worker that dies is restarted by Ray (`max_restarts=-1`); its new
incarnation asks the scheduler for tickets and gets its envs' unfinished episodes back.
Servers receive weights through the Ray object store (ServerGroup.update_params); a
server that dies is restarted by Ray at its address, with the latest weights.
Placement: `config.ray_resources` names the node label each kind of actor needs.
In a multi-host JAX run only process 0 starts actors; the others follow (see
FollowerRollout) and receive the same batches.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import List, Optional, Sequence

from absl import logging
import ml_collections
import ray

from rollx import console, hostmem, stopping
from rollx.errors import RolloutError
from rollx.parallel import distributed
from rollx.rollout.env_worker import EnvWorker
from rollx.rollout.scheduler import RolloutScheduler, env_layout
from rollx.serving import server as server_lib


def init_ray(config: ml_collections.ConfigDict) -> bool:
  """Joins `config.ray_address` or an already running Ray, else starts a local one;
  True when this call started it (the caller then shuts it down)."""
  if ray.is_initialized():
    return False
  if config.get("ray_address"):  # a cluster that outlives this run: only disconnect at the end
    ray.init(address=config.ray_address, namespace="rollx", log_to_driver=False)
  else:
    start_local_ray(include_dashboard=False, log_to_driver=False, namespace="rollx")
  return True


# How Ray says that its local node's start timed out (a bare Exception, or a RuntimeError
# naming the GCS port file a process did not write in time).
_NODE_START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")


def start_local_ray(attempts: int = 3, **init_args) -> None:
  """`ray.init(**init_args)` of a local instance. Its node start can time out on a
  loaded machine, typically while another process's cluster starts or is torn down; a
  failed start is cleaned up and retried.

  Its workers run at the trainer's priority: Ray starts workers at nice 15, and on a
  host whose cores the trainer keeps busy (a CPU run, or a test beside another) such a
  worker gets a few percent of a core: with two busy processes on 2 cores, env workers
  took 100 s to start and a killed one was still restarting 90 s later (at nice 0 the
  whole kill-and-recover test takes 17-20 s there)."""
  system_config = dict(init_args.pop("_system_config", None) or {})
  system_config.setdefault("worker_niceness", 0)
  init_args["_system_config"] = system_config
  for attempt in range(attempts):
    try:
      ray.init(**init_args)
      return
    except Exception as e:  # noqa: BLE001 - the timeout is a bare Exception
      ray.shutdown()
      if attempt + 1 == attempts or not any(m in str(e) for m in _NODE_START_TIMEOUTS):
        raise
      logging.warning("Ray's local node did not start (%s); retrying", e)
      time.sleep(5)


def shutdown_ray(owned: bool) -> None:
  if owned:  # tear the local cluster down now, not in an atexit race
    ray.shutdown()


# A label needs to be present, not counted: each actor asks for a sliver of it, so a
# node started with `--resources='{"rollx_env": 1}'` takes up to 1000 of them.
LABEL_AMOUNT = 0.001


def placement(config: ml_collections.ConfigDict, role: str) -> dict:
  """Ray `resources=` for an actor of `role` (a key of config.ray_resources): the node
  label it must run on, or {} (any node)."""
  label = config.get("ray_resources", {}).get(role, "")
  return {label: LABEL_AMOUNT} if label else {}


# -- actor_infer -----------------------------------------------------------------------


class ServerBoard:
  """What a restarted server needs to pick up where its predecessor stopped: the address
  clients know it by and the latest weights (version, [object ref]; the ref in a list
  so that it is held here, not resolved)."""

  def __init__(self):
    self.addresses: dict = {}
    self.weights = None

  def publish(self, version: int, params_ref: list) -> None:
    self.weights = (int(version), params_ref)

  def restore(self, index: int):
    return self.addresses.get(index), self.weights

  def register(self, index: int, address: str) -> None:
    self.addresses[index] = address


class ServerActor:
  """A rollout server inside a Ray actor. Weights arrive as (numpy) params through the
  object store and are swapped between generate steps (see RolloutServer.update_params).

  Restarts: Ray re-runs this constructor when the process dies (max_restarts). The new
  server binds the address of the one it replaces (the env workers' clients know only
  that one; a restart that lands on another node is unreachable, and the clients' wait
  for it ends in a RolloutError) and starts from the latest weights on the board, so
  its first token already carries the current policy version."""

  def __init__(self, config_dict: dict, index: int = 0, board=None,
               host: str | None = "127.0.0.1", port: int = 0):
    hostmem.use_server_malloc()  # before the engine allocates (rollx.hostmem)
    if host is None:  # in a cluster: this node's address, which env workers elsewhere can reach
      host = ray.util.get_node_ip_address()
    params, version = None, 0
    if board is not None:
      previous, weights = ray.get(board.restore.remote(index))
      if previous is not None:
        port = int(previous.rsplit(":", 1)[1])
      if weights is not None:
        version, (ref,) = weights
        params = ray.get(ref)
    self.server = server_lib.server_from_config(ml_collections.ConfigDict(config_dict), host, port,
                                                params=params, version=version)
    if board is not None:
      ray.get(board.register.remote(index, self.server.address))

  def address(self) -> str:
    return self.server.address

  def version(self) -> int:
    return self.server.version

  def stats(self) -> dict:
    return self.server.stats()

  def update_params(self, params, version: int, abort_in_flight: bool = False) -> int:
    return self.server.update_params(params, version, abort_in_flight)

  def stop(self) -> None:
    self.server.stop()

  def pid(self) -> int:
    import os
    return os.getpid()


@dataclasses.dataclass
class ServerGroup:
  """A run's rollout servers: their actors, addresses, and the board restarts read."""
  actors: list
  addresses: List[str]
  board: object = None

  def update_params(self, params, version: int, abort_in_flight: bool = False) -> None:
    """Weight sync: the params go into the object store once, onto the board (so that a
    server restarted from now on starts from them), then to every server. A push to a
    server that is restarting waits for its restart (the actor retries the call)."""
    if not self.actors:  # multi-host followers: process 0 pushes
      return
    ref = ray.put(params)
    ray.get(self.board.publish.remote(version, [ref]))
    pushes = [a.update_params.remote(ref, version, abort_in_flight) for a in self.actors]
    for address, push in zip(self.addresses, pushes):
      try:
        ray.get(push)
      except ray.exceptions.RayActorError as e:  # dead, and its restarts are used up
        cause = str(e).strip().splitlines()[0]
        raise RolloutError(f"rollout server {address} died and cannot restart: {cause}") from None

  def versions(self) -> List[int]:
    return ray.get([a.version.remote() for a in self.actors])

  def stop(self) -> None:
    for actor in self.actors:
      ray.kill(actor, no_restart=True)
    if self.board is not None:
      ray.kill(self.board)


def start_servers(config: ml_collections.ConfigDict, num_servers: Optional[int] = None,
                  host: str | None = None, resources: dict | None = None) -> ServerGroup:
  """`num_servers` ServerActors (default: actor_infer.strategy_args.num_servers), each
  restarted by Ray up to strategy_args.max_restarts times.

  By default they run on the nodes labelled config.ray_resources.server and bind
  127.0.0.1, or, when joining a cluster (config.ray_address), their node's IP. In a
  multi-host JAX run only process 0 starts them (the others get no actors, so their
  weight pushes are no-ops, and the same addresses)."""
  if not distributed.is_coordinator():
    # Multi-host JAX: process 0 owns the servers; the others only learn where they are.
    return ServerGroup([], distributed.broadcast_object(None))
  s = config.actor_infer.strategy_args
  n = num_servers or s.num_servers
  if host is None and not config.get("ray_address"):
    host = "127.0.0.1"
  if resources is None:
    resources = placement(config, "server")
  board = ray.remote(num_cpus=0)(ServerBoard).remote()
  actor_cls = ray.remote(num_cpus=0, resources=resources, max_restarts=s.max_restarts,
                         max_task_retries=-1 if s.max_restarts else 0)(ServerActor)
  with console.native_stderr_filtered(_BY_REFERENCE_NOTICE):  # see start_rollout
    actors = [actor_cls.remote(config.to_dict(), i, board, host) for i in range(n)]
  addresses = ray.get([a.address.remote() for a in actors])
  return ServerGroup(actors, distributed.broadcast_object(addresses), board)


def stop_servers(servers: Optional[ServerGroup]) -> None:
  if servers is not None:
    servers.stop()


# -- env workers and the scheduler ---------------------------------------------------------


class _SchedulerLink:
  """The scheduler actor seen as the async object EnvManager expects."""

  def __init__(self, handle):
    self.handle = handle

  async def next_ticket(self, env_id):
    return await self.handle.next_ticket.remote(env_id)

  async def put(self, trajectory):
    await self.handle.put.remote(trajectory)

  async def report_error(self, ticket, error):
    await self.handle.report_error.remote(ticket, error)

  async def fail(self, error):
    await self.handle.fail.remote(error)


class EnvWorkerActor(EnvWorker):
  """An EnvWorker in a Ray actor: it reaches the scheduler actor through its handle and
  starts its loops as soon as it is up (a call to itself from its constructor), including
  after a restart by Ray. A trainer waiting for a batch also makes sure they run
  (Rollout.check_workers): a restarted worker whose start call failed was seen alive with
  no loop running, its envs' episodes outstanding and the batch waiting for them."""

  def __init__(self, config_dict: dict, manager: str, env_ids: Sequence[int], scheduler,
               server_addresses: Sequence[str], render_env_ids: Sequence[int] = ()):
    super().__init__(ml_collections.ConfigDict(config_dict), manager, env_ids,
                     _SchedulerLink(scheduler), server_addresses, render_env_ids)
    # A restarted actor's call to itself can reach it while Ray still marks it restarting
    # (its constructor has not returned): Ray fails such a call (ACTOR_UNAVAILABLE) unless
    # it may be retried. start is idempotent.
    ray.get_runtime_context().current_actor.start.options(max_task_retries=-1).remote()

  def pid(self) -> int:
    import os
    return os.getpid()


@dataclasses.dataclass
class Rollout:
  """Handles of one env manager's rollout system (scheduler + env workers)."""
  scheduler: object
  workers: list
  env_ids_per_worker: List[List[int]]
  # Restartable actors are re-created from their constructor arguments: the config
  # is put in the object store once and pinned here for the actors' lifetime.
  config_ref: object = None

  def get_batch(self, batch_size: int):
    pending = self.scheduler.get_batch.remote(batch_size)
    try:
      checked = time.monotonic()
      while not ray.wait([pending], timeout=STOP_CHECK_S)[0]:
        stopping.check()  # a stop signal drops the batch being collected
        if time.monotonic() - checked > WORKER_CHECK_S:
          self.check_workers()
          checked = time.monotonic()
      batch = ray.get(pending)
    except ray.exceptions.RayTaskError as e:
      if isinstance(e.cause, RolloutError):  # the message, not Ray's traceback around it
        raise RolloutError(str(e.cause)) from None
      raise
    # Multi-host: every JAX process trains on this batch; see FollowerRollout.
    return distributed.broadcast_object(batch)

  def check_workers(self) -> None:
    """Starts the env loops of a worker whose loops are not running (never started, or
    ended cancelled: EnvWorker.start), and raises RolloutError when an env worker is gone
    for good (Ray restarts a killed one; one whose constructor fails, or that was killed
    for good, is not): either way its envs' tickets would stay outstanding and the batch
    never complete. A worker that is restarting, or too busy to answer in time, is left
    to carry on."""
    checks = {w.ensure_running.remote(): i for i, w in enumerate(self.workers)}
    for attempt in range(2):
      # one wait for all: the ones not back in time are restarting or busy
      ready, _ = ray.wait(list(checks), num_returns=len(checks), timeout=WORKER_CHECK_S)
      again = {}
      for check in ready:
        index = checks[check]
        where = f"env worker {index} (env ids {self.env_ids_per_worker[index]})"
        try:
          ray.get(check)
        except ray.exceptions.ActorDiedError as e:
          # a call the worker died under fails so even when Ray restarts it; a call to a
          # worker that is dead for good fails so again at once
          if attempt:
            raise RolloutError(f"{where} is dead and will not restart: {_last_line(e)}") \
                from None
          again[self.workers[index].ensure_running.remote()] = index
        except ray.exceptions.ActorUnavailableError:
          pass  # restarting
        except ray.exceptions.RayTaskError as e:  # one of its env loops crashed
          raise RolloutError(f"{where}: an env loop stopped: {type(e.cause).__name__}: "
                             f"{e.cause}") from None
      if not again:
        return
      checks = again

  def set_version(self, version: int) -> None:
    ray.get(self.scheduler.set_version.remote(version))

  def stream_state(self) -> dict:
    """Where each level stream stands (checkpointed: a resumed run plays the next levels)."""
    return ray.get(self.scheduler.stream_state.remote())

  def load_stream_state(self, state: dict) -> None:
    ray.get(self.scheduler.load_stream_state.remote(state))

  def stop(self) -> None:
    ray.get(self.scheduler.stop.remote())
    for w in self.workers:
      ray.kill(w, no_restart=True)
    ray.kill(self.scheduler)


# How often a trainer waiting for a batch checks that every env worker is there and
# running its loops: loops that stopped cost a batch at most this long.
WORKER_CHECK_S = 10.0
# How soon a trainer waiting for a batch sees a stop signal (rollx.stopping).
STOP_CHECK_S = 0.25


def _last_line(error: Exception) -> str:
  """The last line of a Ray error's message: the cause (Ray puts the actor's details first)."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return lines[-1] if lines else type(error).__name__


class FollowerRollout:
  """What start_rollout gives JAX processes other than 0 in a multi-host run: no actors
  of its own (process 0 drives the one rollout system), the same batches as process 0
  (received in get_batch, a collective made at the same point on every process), and
  no stream state (the checkpoint's stream state is process 0's to save)."""

  workers = ()

  def get_batch(self, batch_size: int):
    return distributed.broadcast_object(None)

  def set_version(self, version: int) -> None:
    pass

  def stream_state(self) -> None:
    return None

  def load_stream_state(self, state: dict) -> None:
    pass

  def stop(self) -> None:
    pass


_BY_REFERENCE_NOTICE = re.compile(
    r"^\[[^\]]+\] core_worker\.cc:\d+: Actor with class name: '\w+' and ID: '\w+' has "
    r"constructor arguments in the object store and max_restarts > 0")


def start_rollout(config: ml_collections.ConfigDict, manager: str,
                  server_addresses: Sequence[str], render_env_ids: Sequence[int] = (),
                  stream: Optional[str] = None, resources: Optional[dict] = None) -> Rollout:
  """Scheduler actor + ceil(envs / max_env_num_per_worker) env worker actors, on the
  nodes labelled config.ray_resources.env_worker unless `resources` says otherwise.
  In a multi-host JAX run only process 0 starts them; the others get a FollowerRollout."""
  if not distributed.is_coordinator():
    return FollowerRollout()
  m = config[manager]
  env_ids = sorted(s.env_id for s in env_layout(m))
  per_worker = int(m.max_env_num_per_worker)
  chunks = [env_ids[i:i + per_worker] for i in range(0, len(env_ids), per_worker)]
  assert len(chunks) == math.ceil(len(env_ids) / per_worker)
  scheduler = ray.remote(num_cpus=0)(RolloutScheduler).options(max_concurrency=10000).remote(
      config, manager, stream)
  if resources is None:
    resources = placement(config, "env_worker")
  worker_cls = ray.remote(num_cpus=0, max_restarts=-1, resources=resources)(EnvWorkerActor)
  # Restartable actors are re-created from their constructor arguments: the config
  # is put in the object store once and pinned here for the actors' lifetime, and the
  # scheduler's handle lives as long as the rollout. Ray's core worker logs that such
  # arguments could be gone by a restart (ray-project/ray#53727), once per start, on
  # stderr: that notice is dropped (rollx.console).
  config_ref = ray.put(config.to_dict())
  with console.native_stderr_filtered(_BY_REFERENCE_NOTICE):
    workers = [worker_cls.options(max_concurrency=10000).remote(
        config_ref, manager, chunk, scheduler, list(server_addresses), list(render_env_ids))
        for chunk in chunks]
  return Rollout(scheduler, workers, chunks, config_ref)
