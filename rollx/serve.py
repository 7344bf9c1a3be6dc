"""Entry point: a JetStream rollout server (actor_infer) for a config.

    python -m rollx.serve --config=configs/frozenlake.py [--host=127.0.0.1 --port=9000]

Serves the policy named by `pretrain` (unset: the built-in default model) with
`actor_infer`'s settings until SIGTERM/SIGINT; prints `serving on HOST:PORT` once
ready. In training the same server runs in a Ray actor (rollx.cluster), and the
trainer pushes weights to it through the Ray object store.
"""

from __future__ import annotations

import signal
import threading
from absl import app, flags

from rollx import cli
from rollx.serving import server as server_lib

_HOST = flags.DEFINE_string("host", "127.0.0.1", "interface to bind")
_PORT = flags.DEFINE_integer("port", 0, "port to bind (0 = any free port)")


def main(argv) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  server = server_lib.server_from_config(config, _HOST.value, _PORT.value)
  print(f"serving on {server.address}", flush=True)
  stop = threading.Event()
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  stop.wait()
  server.stop()


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
