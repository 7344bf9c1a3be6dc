"""Named meshes per worker role, built from `strategy_args` and `device_mapping`.

Axis order (outer to inner) is pipeline, data, fsdp, tensor: tensor-parallel
collectives run every layer, so its devices are the innermost (closest) ones;
pipeline stages only exchange activations once per microbatch, so they can span
the farthest links (across hosts).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rollx.errors import ConfigError

PIPELINE = "pipeline"
DATA = "data"
FSDP = "fsdp"
TENSOR = "tensor"
MESH_AXES = (PIPELINE, DATA, FSDP, TENSOR)
# Rows of a batch are split over every axis that holds a distinct replica of the
# computation: data and fsdp (fsdp shards params, not work).
BATCH_AXES = (DATA, FSDP)
STRATEGY_KEYS = {PIPELINE: "pp_size", DATA: "dp_size", FSDP: "fsdp_size", TENSOR: "tp_size"}


def mesh_shape(strategy_args, num_devices: int, role: str = "actor_train") -> Dict[str, int]:
  """Axis sizes; one size may be -1 (fill). A product that does not match is a ConfigError."""
  sizes = {axis: int(strategy_args[key]) for axis, key in STRATEGY_KEYS.items()}
  keys = ", ".join(f"{role}.strategy_args.{STRATEGY_KEYS[a]}={sizes[a]}" for a in MESH_AXES)
  fill = [a for a, s in sizes.items() if s == -1]
  if len(fill) > 1:
    raise ConfigError([(f"{role}.strategy_args", f"only one size may be -1 (fill): {keys}")])
  known = math.prod(s for s in sizes.values() if s != -1)
  if fill:
    if num_devices % known:
      raise ConfigError([(f"{role}.strategy_args.{STRATEGY_KEYS[fill[0]]}",
                          f"cannot fill: {num_devices} devices are not a multiple of {known} "
                          f"({keys})")])
    sizes[fill[0]] = num_devices // known
  if math.prod(sizes.values()) != num_devices:
    raise ConfigError([(f"{role}.strategy_args",
                        f"{keys} multiply to {math.prod(sizes.values())}, but "
                        f"{role}.device_mapping gives {num_devices} devices")])
  return sizes


def role_devices(device_mapping: Optional[Sequence[int]], role: str = "actor_train",
                 devices: Optional[Sequence[jax.Device]] = None):
  devices = list(devices if devices is not None else jax.devices())
  if device_mapping is None:
    return devices
  bad = [d for d in device_mapping if d >= len(devices)]
  if bad:
    raise ConfigError([(f"{role}.device_mapping",
                        f"device ids {bad} do not exist ({len(devices)} devices)")])
  return [devices[d] for d in device_mapping]


def make_mesh(strategy_args, device_mapping: Optional[Sequence[int]] = None,
              role: str = "actor_train", devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  devs = role_devices(device_mapping, role, devices)
  sizes = mesh_shape(strategy_args, len(devs), role)
  grid = np.array(devs, dtype=object).reshape([sizes[a] for a in MESH_AXES])
  return Mesh(grid, MESH_AXES)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Rows over data x fsdp, everything else replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
