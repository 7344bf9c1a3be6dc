"""Multi-host JAX: one process per host, wired up from the environment.

    ROLLX_COORDINATOR_ADDRESS=10.0.0.2:8476 ROLLX_NUM_PROCESSES=4 ROLLX_PROCESS_ID=1 \
        python -m rollx.train --config=...

`maybe_initialize()` (first thing in rollx.train) calls `jax.distributed.initialize`
when the environment describes more than one process; after that `jax.devices()`
lists every host's devices, so the meshes of rollx.parallel.mesh span the whole
slice, and every process runs the same jitted steps on its share of each array.
`ROLLX_DISTRIBUTED=auto` instead lets JAX find the cluster itself (Cloud TPU
metadata, SLURM, ...). The launch scripts (launch/node.sh) set these variables.

With one process every helper here is a plain local operation, so callers need
no `if multi_host` branches.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

COORDINATOR = "ROLLX_COORDINATOR_ADDRESS"
NUM_PROCESSES = "ROLLX_NUM_PROCESSES"
PROCESS_ID = "ROLLX_PROCESS_ID"
LOCAL_DEVICE_IDS = "ROLLX_LOCAL_DEVICE_IDS"  # optional: this process's devices, e.g. "0,1"
AUTO = "ROLLX_DISTRIBUTED"  # "auto": jax.distributed.initialize() detects the cluster
TIMEOUT = "ROLLX_DISTRIBUTED_TIMEOUT"  # seconds to wait for every process to join


class DistributedEnvError(ValueError):
  """A ROLLX_* variable is missing or malformed; the message names it."""


@dataclasses.dataclass(frozen=True)
class Settings:
  coordinator_address: str | None  # None with auto: JAX finds it
  num_processes: int | None
  process_id: int | None
  local_device_ids: tuple[int, ...] | None = None
  timeout_s: int = 300

  @property
  def auto(self) -> bool:
    return self.coordinator_address is None


def _int(environ: Mapping[str, str], name: str) -> int:
  value = environ.get(name, "")
  try:
    return int(value)
  except ValueError:
    raise DistributedEnvError(f"{name}={value!r} is not an integer") from None


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings | None:
  """What the environment asks for; None = a single process (nothing to initialise)."""
  env = os.environ if environ is None else environ
  timeout = _int(env, TIMEOUT) if env.get(TIMEOUT) else 300
  local = None
  if env.get(LOCAL_DEVICE_IDS):
    try:
      local = tuple(int(d) for d in env[LOCAL_DEVICE_IDS].split(","))
    except ValueError:
      raise DistributedEnvError(f"{LOCAL_DEVICE_IDS}={env[LOCAL_DEVICE_IDS]!r} is not a "
                                "comma-separated list of device ids") from None
  mode = env.get(AUTO, "").strip().lower()
  if mode not in ("", "auto", "off"):
    raise DistributedEnvError(f"{AUTO}={env[AUTO]!r}: expected 'auto' or 'off'")
  if mode == "off":
    return None
  if not env.get(COORDINATOR):
    if mode == "auto":
      return Settings(None, None, None, local, timeout)
    stray = [n for n in (NUM_PROCESSES, PROCESS_ID) if env.get(n)]
    if stray:  # half a configuration is a mistake, not a request for one process
      raise DistributedEnvError(f"{stray[0]} is set but {COORDINATOR} is not")
    return None
  address = env[COORDINATOR]
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise DistributedEnvError(f"{COORDINATOR}={address!r}: expected host:port")
  for name in (NUM_PROCESSES, PROCESS_ID):
    if not env.get(name):
      raise DistributedEnvError(f"{COORDINATOR} is set but {name} is not")
  n, i = _int(env, NUM_PROCESSES), _int(env, PROCESS_ID)
  if n < 1:
    raise DistributedEnvError(f"{NUM_PROCESSES}={n}: must be >= 1")
  if not 0 <= i < n:
    raise DistributedEnvError(f"{PROCESS_ID}={i}: must be in [0, {NUM_PROCESSES}={n})")
  if n == 1:
    return None
  return Settings(address, n, i, local, timeout)


def maybe_initialize(environ: Mapping[str, str] | None = None) -> bool:
  """jax.distributed.initialize from the ROLLX_* variables; True if this is a
  multi-process run. Must run before anything touches a JAX backend."""
  if jax.distributed.is_initialized():
    return True
  settings = settings_from_env(environ)
  if settings is None:
    return False
  if settings.auto:
    jax.distributed.initialize(local_device_ids=settings.local_device_ids,
                               initialization_timeout=settings.timeout_s)
  else:
    jax.distributed.initialize(settings.coordinator_address, settings.num_processes,
                               settings.process_id, local_device_ids=settings.local_device_ids,
                               initialization_timeout=settings.timeout_s)
  return True


def is_coordinator() -> bool:
  """Process 0: the one that drives Ray, writes logs and talks to the user."""
  return jax.process_index() == 0


def to_host(tree: Any) -> Any:
  """numpy copy of a pytree whose arrays may be sharded over several hosts.

  `jax.device_get` only reads shards this process holds; a multi-host array is
  gathered (a collective: every process must make the same call)."""
  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:  # every host already holds all of it
        return np.asarray(x.addressable_data(0))
      from jax.experimental import multihost_utils
      return multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))
  return jax.tree.map(one, tree)


def broadcast_object(obj: Any = None) -> Any:
  """Process 0's `obj` (any picklable value) on every process; other processes'
  arguments are ignored. A collective: every process must call it.

  Used for what only process 0 computes outside JAX (a rollout batch from Ray) but
  every process needs to feed the same global arrays to a jitted step."""
  if jax.process_count() == 1:
    return obj
  from jax.experimental import multihost_utils
  payload = np.frombuffer(pickle.dumps(obj) if is_coordinator() else b"", np.uint8)
  # Two rounds: the size, so that every process allocates the same buffer shape.
  size = int(multihost_utils.broadcast_one_to_all(np.int64(payload.size)))
  buf = payload if is_coordinator() else np.zeros(size, np.uint8)
  data = multihost_utils.broadcast_one_to_all(buf)
  return obj if is_coordinator() else pickle.loads(np.asarray(data).tobytes())
