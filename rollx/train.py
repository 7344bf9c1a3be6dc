"""Entry point: `python -m rollx.train --config=configs/frozenlake.py [--config.KEY=VALUE ...]`.

Parses flags, validates the config once (a bad key or value exits with one line
naming it), and runs the AgenticPipeline.
"""

from __future__ import annotations

from typing import List

from absl import app, flags, logging
import ml_collections

from rollx import cli

def run(config: ml_collections.ConfigDict):
  """The agentic RL loop (rollx.pipeline.AgenticPipeline) until config.max_steps."""
  from rollx.pipeline import AgenticPipeline  # heavy imports after flag parsing
  return AgenticPipeline(config).run()


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:  # Orbax and JetStream log every step at INFO
    logging.set_verbosity(logging.WARNING)
  run(cli.load_config())


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
