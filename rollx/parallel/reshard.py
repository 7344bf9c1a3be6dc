"""Moving params between role meshes (actor_train -> actor_infer weight sync).

The trainer's params live on its mesh with the training shardings (fsdp, pp,
...). An inference server wants them on its own devices with its own layout
(tensor-parallel, no fsdp, no stages). `reshard` computes the target shardings
from the same partition rules on the target mesh and lets `jax.device_put` move
each array device-to-device; nothing goes through host files.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from rollx.models import partition


def reshard(params, target_mesh: Mesh):
  return jax.device_put(params, partition.param_shardings(params, target_mesh))
