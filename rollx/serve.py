"""Entry point: a JetStream rollout server (actor_infer) for a config.

    python -m rollx.serve --config=configs/frozenlake.py [--host=127.0.0.1 --port=9000]

Serves the policy named by `pretrain` (unset: the built-in default model) with
`actor_infer`'s settings until SIGTERM/SIGINT; prints `serving on HOST:PORT` once
ready. The same server runs as a Ray actor (`ServerActor`, `start_ray_servers`):
the trainer then pushes weights through the Ray object store.
"""

from __future__ import annotations

import signal
import threading
from typing import List, Optional, Tuple

from absl import app, flags
import ml_collections

from rollx import cli, models
from rollx.config import ConfigError
from rollx.models import hf
from rollx.parallel import mesh as mesh_lib

_HOST = flags.DEFINE_string("host", "127.0.0.1", "interface to bind")
_PORT = flags.DEFINE_integer("port", 0, "port to bind (0 = any free port)")


def build_engine(config: ml_collections.ConfigDict, params=None, version: int = 0,
                 devices=None):
  """A RollxEngine for `config.actor_infer` (weights from `pretrain` unless given)."""
  from rollx.serving.engine import RollxEngine, Sampling
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
      hf_tokenizer=tokenizer, pad_id=tokenizer.pad_token_id or 0, mesh=mesh, seed=config.seed)


def start_server(config: ml_collections.ConfigDict, host: str = "127.0.0.1", port: int = 0,
                 params=None, version: int = 0):
  from rollx.serving.server import RolloutServer
  return RolloutServer(build_engine(config, params, version), host=host, port=port,
                       detokenize_depth=config.actor_infer.strategy_args.detokenize_depth)


class ServerActor:
  """A rollout server inside a Ray actor. Weights arrive as (numpy) params through the
  object store and are swapped between generate steps (see RolloutServer.update_params)."""

  def __init__(self, config_dict: dict, host: str | None = "127.0.0.1", port: int = 0):
    if host is None:  # in a cluster: this node's address, which env workers elsewhere can reach
      import ray
      host = ray.util.get_node_ip_address()
    self.server = start_server(ml_collections.ConfigDict(config_dict), host, port)

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


def start_ray_servers(config: ml_collections.ConfigDict, num_servers: Optional[int] = None,
                      host: str | None = None, resources: dict | None = None
                      ) -> Tuple[list, List[str]]:
  """`num_servers` ServerActors (default: actor_infer.strategy_args.num_servers);
  returns (actor handles, their addresses).

  By default they run on the nodes labelled config.ray_resources.server and bind
  127.0.0.1, or, when joining a cluster (config.ray_address), their node's IP. In a
  multi-host JAX run only process 0 starts them (the others get no handles, so their
  weight pushes are no-ops, and the same addresses)."""
  import ray

  from rollx.parallel import distributed
  from rollx.rollout.env_worker import placement
  if not distributed.is_coordinator():
    # Multi-host JAX: process 0 owns the servers; the others only learn where they are.
    return [], distributed.broadcast_object(None)
  n = num_servers or config.actor_infer.strategy_args.num_servers
  if host is None and not config.get("ray_address"):
    host = "127.0.0.1"
  if resources is None:
    resources = placement(config, "server")
  actor_cls = ray.remote(num_cpus=0, resources=resources)(ServerActor)
  actors = [actor_cls.remote(config.to_dict(), host) for _ in range(n)]
  return actors, distributed.broadcast_object(ray.get([a.address.remote() for a in actors]))


def main(argv) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  server = start_server(config, _HOST.value, _PORT.value)
  print(f"serving on {server.address}", flush=True)
  stop = threading.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  stop.wait()
  server.stop()


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
