"""Entry point: `python -m rollx.train --config=configs/frozenlake.py [--config.KEY=VALUE ...]`.

Parses flags, validates the config once (a bad key or value exits with one line
naming it), joins the other hosts' processes when the environment says there are
several (rollx.parallel.distributed; launch/ sets ROLLX_*), connects to a running
Ray cluster when `ray_address` is set, and runs the AgenticPipeline. It first
re-executes itself once with glibc's malloc tuned for XLA:CPU (rollx.hostmem).
"""

from __future__ import annotations

from typing import List

from absl import app
import ml_collections

from rollx import cli, hostmem

def run(config: ml_collections.ConfigDict):
  """The agentic RL loop (rollx.pipeline.AgenticPipeline) until config.max_steps."""
  from rollx.pipeline import AgenticPipeline  # heavy imports after flag parsing
  return AgenticPipeline(config).run()


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  cli.quiet_console()  # no library INFO records; --verbosity=0 shows them
  from rollx.parallel import distributed
  try:  # before anything touches a JAX backend
    distributed.maybe_initialize()
  except distributed.DistributedEnvError as e:
    cli.fail(str(e))
  from rollx.errors import RolloutError
  try:
    run(config)
  except RolloutError as e:  # one line, after the pipeline saved a checkpoint
    cli.fail(str(e))


if __name__ == "__main__":
  hostmem.reexec_with_tuned_malloc()  # glibc reads its malloc settings at start only
  app.run(main, flags_parser=cli.parse_flags)
