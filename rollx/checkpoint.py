"""Orbax checkpoints of the whole run: train states, KL controller, step, RNG, env streams.

Orbax writes each step into a temporary directory and renames it into place when
complete, so a crash (even kill -9) mid-save leaves no directory that `latest`
would pick; `max_to_keep` prunes old steps. Train states are restored straight
into their shardings (the abstract state carries them), so a resumed run is
bitwise the saved one.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

# Test hook (tests/test_resume.py): with ROLLX_HOLD_CHECKPOINT=<step> set, the save of
# that step writes everything into Orbax's temporary directory, prints HOLD_MESSAGE and
# then never commits (no rename into place), so a test can kill -9 the process
# deterministically in the middle of a checkpoint write. Unset, Orbax runs as is.
HOLD_ENV = "ROLLX_HOLD_CHECKPOINT"
HOLD_MESSAGE = "checkpoint {step}: written, holding before the commit"


class _HoldBeforeCommit(ocp.path.atomicity.AtomicRenameTemporaryPath):

  async def finalize(self, *args, **kwargs):
    step = self.get_final().name  # the step directory (items inside it are named)
    if step == os.environ.get(HOLD_ENV):
      print(HOLD_MESSAGE.format(step=step), flush=True)
      threading.Event().wait()  # forever: the test kills the process here
    await super().finalize(*args, **kwargs)


class Checkpointer:

  def __init__(self, directory: str, max_to_keep: int = 3):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True,
            temporary_path_class=_HoldBeforeCommit if os.environ.get(HOLD_ENV) else None))

  def save(self, step: int, states: Dict[str, Any], meta: Dict[str, Any]) -> None:
    args = {name: ocp.args.StandardSave(_global(state)) for name, state in states.items()}
    args["meta"] = ocp.args.JsonSave(meta)
    self.manager.save(step, args=ocp.args.Composite(**args))
    self.manager.wait_until_finished()

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def restore(self, step: int, abstract_states: Dict[str, Any]):
    args = {name: ocp.args.StandardRestore(_global(abstract))
            for name, abstract in abstract_states.items()}
    args["meta"] = ocp.args.JsonRestore()
    restored = self.manager.restore(step, args=ocp.args.Composite(**args))
    return {name: restored[name] for name in abstract_states}, restored["meta"]

  def close(self) -> None:
    self.manager.close()


def _global(tree):
  """Multi-host: Orbax only takes arrays that live on the global device set; a
  process-local array (the RNG key, made by each process alike) is saved and restored
  as one replicated over all devices. Every host writes its shards, and Orbax's
  primary host (process 0) the metadata and JSON."""
  if jax.process_count() == 1:
    return tree
  replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices(), ("all",)),
                                          jax.sharding.PartitionSpec())

  def one(x):
    if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None:
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated)
    if isinstance(x, jax.Array) and x.is_fully_addressable:
      return jax.make_array_from_callback(x.shape, replicated, lambda i: np.asarray(x)[i])
    return x
  return jax.tree.map(one, tree)


def resolve_resume(resume_from_checkpoint: str, output_dir: str):
  """(checkpoint dir, step) to resume from, or None. 'true' = latest under output_dir;
  a path is a checkpoint directory (`.../checkpoints`) or one step inside it."""
  value = (resume_from_checkpoint or "").strip()
  if value.lower() in ("", "false", "none"):
    return None
  if value.lower() in ("true", "latest"):
    directory = os.path.join(output_dir, "checkpoints")
    step = Checkpointer(directory).latest_step() if os.path.isdir(directory) else None
    return (directory, step) if step is not None else None
  path = os.path.abspath(value)
  if os.path.basename(path).isdigit():
    return os.path.dirname(path), int(os.path.basename(path))
  if not os.path.isdir(path):
    raise FileNotFoundError(f"resume_from_checkpoint={value!r}: no such directory")
  step = Checkpointer(path).latest_step()
  if step is None:
    raise FileNotFoundError(f"resume_from_checkpoint={value!r}: no complete checkpoint in it")
  return path, step


def abstract_of(tree, shardings):
  """ShapeDtypeStructs with shardings: what Orbax restores into."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


# -- the policy alone (rollx.eval) -----------------------------------------------------


def params_metadata(step_dir: str):
  """The tree of the actor's saved params (Orbax ArrayMetadata: shape, dtype) in a step
  directory, read from its metadata only."""
  from etils import epath
  tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(step_dir) / "actor").tree
  if not isinstance(tree, dict) or "params" not in tree:
    raise ValueError(f"{step_dir}/actor holds no params")
  return tree["params"]


def shape_mismatch(saved, like) -> Optional[str]:
  """None when `saved` (params_metadata) has exactly the names and shapes of `like`
  (ShapeDtypeStructs); else what differs first, e.g. "params/embed_tokens has shape
  (640, 128)"."""
  def by_name(tree):
    return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  have, want = by_name(saved), by_name(like)
  for name in sorted(set(have) | set(want)):
    if name not in want:
      return f"params/{name} is in the checkpoint"
    if name not in have:
      return f"params/{name} is missing from the checkpoint"
    if have[name] != want[name]:
      return f"params/{name} has shape {have[name]} (the model: {want[name]})"
  return None


def restore_params(step_dir: str, like):
  """The actor's params of a step directory as numpy arrays, at their saved dtype: a
  partial restore (the optimizer state is not read). `like`: the params' tree
  (ShapeDtypeStructs or arrays)."""
  target = {"params": jax.tree.map(lambda x: np.zeros((), x.dtype), like)}
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
  restored = ocp.PyTreeCheckpointer().restore(
      os.path.join(os.path.abspath(step_dir), "actor"),
      args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True))
  return restored["params"]
