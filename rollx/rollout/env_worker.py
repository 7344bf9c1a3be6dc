"""Ray actors that host the envs, and the wiring of one env manager's rollout system.

    rollout = start_rollout(config, "train_env_manager", server_addresses)
    batch, metrics = rollout.get_batch(config.rollout_batch_size)
    rollout.set_version(step)     # after each weight sync
    rollout.stop()

An `EnvWorker` is a CPU-only async Ray actor holding up to `max_env_num_per_worker`
env managers; each runs its own `run_rollout_loop` as an asyncio task, so a slow
env (a tool call, a web page) holds up nobody. The workers talk to the scheduler
actor (tickets, trajectories) and to the JetStream servers (gRPC) directly. A
worker that dies is restarted by Ray (`max_restarts=-1`); its new incarnation asks
the scheduler for tickets and gets its envs' unfinished episodes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Dict, List, Optional, Sequence

import ml_collections
import ray

from rollx import models
from rollx.models import hf
from rollx.parallel import distributed
from rollx.rollout.env_manager import EnvManager
from rollx.rollout.scheduler import RolloutScheduler, env_layout
from rollx.serving.client import RolloutClient


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


def manager_kwargs(config: ml_collections.ConfigDict, manager: str) -> dict:
  m = config[manager]
  infer = config.actor_infer.strategy_args
  return dict(
      mode="train" if manager == "train_env_manager" else "val",
      sequence_length=min(config.sequence_length, infer.max_cache_length),
      max_prompt_length=infer.max_prefill_length,
      step_wise=m.env_manager_type == "step", history_length=m.history_length,
      symmetric_views=tuple(m.get("symmetric_views", ())))


class EnvWorker:

  def __init__(self, config_dict: dict, manager: str, env_ids: Sequence[int], scheduler,
               server_addresses: Sequence[str], render_env_ids: Sequence[int] = ()):
    config = ml_collections.ConfigDict(config_dict)
    layout = {s.env_id: s for s in env_layout(config[manager])}
    tokenizer = hf.load_tokenizer(models.resolve_model_dir(config.pretrain))
    self.client = RolloutClient(list(server_addresses))
    self.link = _SchedulerLink(scheduler)
    kwargs = manager_kwargs(config, manager)
    self.managers = [
        EnvManager(i, layout[i].tag, config.custom_envs[layout[i].tag].to_dict(), tokenizer,
                   self.client.generate, render=i in set(render_env_ids), **kwargs)
        for i in env_ids]
    self._tasks: List[asyncio.Task] = []
    # Loops start as soon as the actor is up, including after a restart by Ray.
    ray.get_runtime_context().current_actor.start.remote()

  async def start(self) -> int:
    if not self._tasks:
      self._tasks = [asyncio.ensure_future(m.run_rollout_loop(self.link)) for m in self.managers]
    return len(self._tasks)

  async def status(self) -> Dict[str, int]:
    failed = [t for t in self._tasks if t.done() and not t.cancelled() and t.exception()]
    if failed:
      raise failed[0].exception()
    return {"envs": len(self.managers), "running": sum(not t.done() for t in self._tasks),
            "env_errors": sum(m.num_env_errors for m in self.managers)}

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
    # Multi-host: every JAX process trains on this batch; see FollowerRollout.
    return distributed.broadcast_object(ray.get(self.scheduler.get_batch.remote(batch_size)))

  def set_version(self, version: int) -> None:
    ray.get(self.scheduler.set_version.remote(version))

  def stop(self) -> None:
    ray.get(self.scheduler.stop.remote())
    for w in self.workers:
      ray.kill(w, no_restart=True)
    ray.kill(self.scheduler)


class _NoScheduler:
  """Any `scheduler.method.remote(...)` call answered with None (as an ObjectRef, so
  that the caller's ray.get works unchanged)."""

  def __getattr__(self, name):
    return _NoCall()


class _NoCall:
  def remote(self, *args, **kwargs):
    return ray.put(None)


class FollowerRollout:
  """What start_rollout gives JAX processes other than 0 in a multi-host run: no actors
  of its own (process 0 drives the one rollout system), the same batches as process 0
  (received in get_batch, a collective made at the same point on every process), and
  None from scheduler calls (checkpoint stream state is process 0's to save)."""

  scheduler = _NoScheduler()
  workers = ()

  def get_batch(self, batch_size: int):
    return distributed.broadcast_object(None)

  def set_version(self, version: int) -> None:
    pass

  def stop(self) -> None:
    pass


# A label needs to be present, not counted: each actor asks for a sliver of it, so a
# node started with `--resources='{"rollx_env": 1}'` takes up to 1000 of them.
LABEL_AMOUNT = 0.001


def placement(config: ml_collections.ConfigDict, role: str) -> dict:
  """Ray `resources=` for an actor of `role` (a key of config.ray_resources): the node
  label it must run on, or {} (any node)."""
  label = config.get("ray_resources", {}).get(role, "")
  return {label: LABEL_AMOUNT} if label else {}


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
  worker_cls = ray.remote(num_cpus=0, max_restarts=-1, resources=resources)(EnvWorker)
  config_ref = ray.put(config.to_dict())
  workers = [worker_cls.options(max_concurrency=10000).remote(
      config_ref, manager, chunk, scheduler, list(server_addresses), list(render_env_ids))
      for chunk in chunks]
  return Rollout(scheduler, workers, chunks, config_ref)
