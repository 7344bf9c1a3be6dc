"""Entry point: `python -m rollx.train --config=configs/frozenlake.py [--config.KEY=VALUE ...]`.

Parses flags, validates the config once (a bad key or value exits with one line
naming it), joins the other hosts' processes when the environment says there are
several (rollx.parallel.distributed; launch/ sets ROLLX_*), connects to a running
Ray cluster when `ray_address` is set, and runs the AgenticPipeline. It first
re-executes itself once with glibc's malloc tuned for XLA:CPU (rollx.hostmem).
SIGINT or SIGTERM: the pipeline saves its last finished step (rollx.stopping) and the
run ends with one line naming that checkpoint and the command that resumes it; exit
status 128 + the signal's number, as a shell reports it.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import List

from absl import app
import ml_collections

from rollx import cli, hostmem

def run(config: ml_collections.ConfigDict):
  """The warm start when the config asks for one (built once, then reused), then the
  agentic RL loop (rollx.pipeline.AgenticPipeline) until config.max_steps."""
  # heavy imports after flag parsing
  from rollx.pipeline import AgenticPipeline
  from rollx.recipes import warm_start
  warm_start.prepare(config)  # pretrain becomes the start the servers and learner load
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
  from rollx.errors import ConfigError, RolloutError
  from rollx import stopping
  try:
    with stopping.on_signals(immediate=True):  # the pipeline's loop takes them over
      run(config)
  except RolloutError as e:  # one line, after the pipeline saved a checkpoint
    cli.fail(str(e))
  except ConfigError as e:  # found as the run starts (a sandbox the host refuses)
    cli.fail(str(e))
  except stopping.Stopped as e:
    print(stopped_line(e, config), file=sys.stderr, flush=True)
    sys.exit(128 + e.signum)  # as a shell reports a process its signal ended
  except stopping.StopRequested:  # while the run was starting
    signum = stopping.last_signal()
    print(stopped_line(stopping.Stopped(signum, None, None), config), file=sys.stderr,
          flush=True)
    sys.exit(128 + signum)


def stopped_line(stop, config: ml_collections.ConfigDict) -> str:
  """The one line of a run stopped by a signal: where, what it saved, how to go on."""
  if stop.step is None:
    return f"rollx.train: stopped by {stop.signame} while starting, before a step: nothing saved"
  head = f"rollx.train: stopped by {stop.signame} after {stop.step}/{config.max_steps} steps"
  if stop.checkpoint is None:
    return f"{head}: no step had finished, nothing saved"
  args = [a for a in sys.argv[1:] if not a.startswith("--config.resume_from_checkpoint")]
  command = shlex.join([os.path.basename(sys.executable), "-m", "rollx.train", *args,
                        "--config.resume_from_checkpoint=true"])
  return f"{head}: saved {stop.checkpoint}; resume: {command}"


if __name__ == "__main__":
  hostmem.reexec_with_tuned_malloc()  # glibc reads its malloc settings at start only
  app.run(main, flags_parser=cli.parse_flags)
