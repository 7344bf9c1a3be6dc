"""Entry point: a JetStream rollout server (actor_infer) for a config.

    python -m rollx.serve --config=configs/frozenlake.py [--host=127.0.0.1 --port=9000]
        [--openai_port=8000 [--openai_host=127.0.0.1 --openai_api_key=KEY]]

Serves the policy named by `pretrain` (unset: the built-in default model) with
`actor_infer`'s settings until SIGTERM/SIGINT; prints `serving on HOST:PORT` once
ready. With `--openai_port` it also serves OpenAI's chat API over it
(rollx/serving/openai_endpoint.py) and prints `openai endpoint on URL`; an address other
than this machine's loopback needs an API key (`--openai_api_key` or the environment
variable ROLLX_OPENAI_API_KEY) that every request must bear. In training the same
server runs in a Ray actor (rollx.cluster), and the trainer pushes weights to it
through the Ray object store.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from absl import app, flags

from rollx import cli, hostmem
from rollx.serving import server as server_lib

_HOST = flags.DEFINE_string("host", "127.0.0.1", "interface to bind")
_PORT = flags.DEFINE_integer("port", 0, "port to bind (0 = any free port)")
_OPENAI_PORT = flags.DEFINE_integer("openai_port", None,
                                    "also serve OpenAI's /v1 chat API here (0 = any free port)")
_OPENAI_HOST = flags.DEFINE_string("openai_host", "127.0.0.1", "interface of the /v1 API")
_OPENAI_API_KEY = flags.DEFINE_string(
    "openai_api_key", None, "the key /v1 requests must bear (default: $ROLLX_OPENAI_API_KEY)")


async def _serve_openai(config, address: str) -> None:
  from rollx import models
  from rollx.models import hf
  from rollx.serving.client import RolloutClient
  from rollx.serving.openai_chat import EpisodeSettings
  from rollx.serving.openai_endpoint import OpenAIEndpoint
  infer = config.actor_infer.strategy_args
  settings = EpisodeSettings(
      mode="train", sequence_length=min(config.sequence_length, infer.max_cache_length),
      max_prompt_length=infer.max_prefill_length, honour_sampling=True)
  key = _OPENAI_API_KEY.value or os.environ.get("ROLLX_OPENAI_API_KEY") or None
  try:
    endpoint = OpenAIEndpoint(
        RolloutClient([address]).generate,
        hf.load_tokenizer(models.resolve_model_dir(config.pretrain)),
        model_name=models.model_name(config.pretrain), settings=settings,
        host=_OPENAI_HOST.value, port=_OPENAI_PORT.value, api_key=key)
  except ValueError as e:
    cli.fail(f"--openai_host: {e}")
  await endpoint.start()
  print(f"openai endpoint on {endpoint.base_url}", flush=True)
  stop = asyncio.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    asyncio.get_running_loop().add_signal_handler(sig, stop.set)
  await stop.wait()
  await endpoint.stop()


def main(argv) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  hostmem.use_server_malloc()  # a server's malloc settings (rollx.hostmem)
  server = server_lib.server_from_config(config, _HOST.value, _PORT.value)
  print(f"serving on {server.address}", flush=True)
  if _OPENAI_PORT.value is not None:
    try:
      asyncio.run(_serve_openai(config, server.address))
    finally:
      server.stop()
    return
  stop = threading.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  stop.wait()
  server.stop()


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
