"""Entry point: debug the multi-turn loop with one env, in-process (no Ray, no server).

    python -m rollx.play --config=configs/frozenlake.py --env=FrozenLake [--policy=model|human]
    python -m rollx.play --config=configs/webshop.py --env=WebShop --policy=human  # shop by hand

Runs the agent loop the training rollouts run (rollx/rollout/agent_loops.py: the game
loop, or the tool loop, which prints each tool call and result), with the policy
given by `--policy`: `model` decodes locally with the config's model (`pretrain`,
or the built-in default) and actor_infer's sampling (validation sampling with
--val); `human` reads each response from standard input. Every turn prints the
prompt text the model sees, the response, the parsed action and the reward.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import List

from absl import app, flags
import jax

from rollx import cli, models
from rollx.models import hf, llm
from rollx.recipes import warm_start
from rollx.rollout.agent_loops import describe_turn, make_agent_loop
from rollx.rollout.env_manager import EnvManager
from rollx.rollout.types import Ticket
from rollx.serving.client import Generation

FLAGS = flags.FLAGS


class LocalModel:
  """The policy decoding in this process (one request at a time)."""

  def __init__(self, config, temperature: float):
    loaded = models.load_model(config.pretrain)
    self.model, self.params, self.eos = loaded.model, loaded.params, loaded.config.eos_token_id
    self.temperature, self.rng = temperature, jax.random.PRNGKey(config.seed)

  async def __call__(self, request_id, prompt_ids, max_tokens, **_):
    self.rng, key = jax.random.split(self.rng)
    ids = llm.generate(self.model, self.params, prompt_ids, max_tokens, self.eos,
                       self.temperature, key)
    return Generation(ids, 0, [0] * len(ids), "local")


class Human:

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  async def __call__(self, request_id, prompt_ids, max_tokens, **_):
    line = sys.stdin.readline()
    if not line:
      cli.fail("standard input closed before the episode ended")
    ids = self.tokenizer.encode(line.rstrip("\n"), add_special_tokens=False)
    ids = ids[:max_tokens - 1] + [self.tokenizer.eos_token_id]
    return Generation(ids, 0, [0] * len(ids), "human")


def local_manager(config, tag: str, policy=None, val: bool = False, on_turn=None) -> EnvManager:
  """An EnvManager for `tag` cut into samples as the config's rollouts cut them, whose
  policy is the config's model decoding in this process (`policy=None`; sampling of
  actor_infer's val_generating_args with `val`, else its generating_args) or "human"."""
  tokenizer = hf.load_tokenizer(models.resolve_model_dir(config.pretrain))
  g = config.actor_infer.val_generating_args if val else config.actor_infer.generating_args
  if policy == "human":
    policy = Human(tokenizer)
  elif policy is None:
    policy = LocalModel(config, g.temperature)
  manager = config.val_env_manager if val else config.train_env_manager
  return make_agent_loop(0, tag, config.custom_envs[tag].to_dict(), tokenizer, policy,
                    mode="val" if val else "train", sequence_length=config.sequence_length,
                    max_new_tokens=g.max_new_tokens,  # a turn's cap, as in the rollouts
                    on_turn=on_turn, step_wise=manager.env_manager_type == "step",
                    history_length=manager.history_length)


def print_turn(manager: EnvManager, record: dict) -> None:
  print(describe_turn(manager.tokenizer, record), flush=True)


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  warm_start.prepare(config, build_missing=False)  # the model its training runs started from
  tags = list(config.custom_envs.keys())
  if FLAGS.env not in tags:
    cli.fail(f"--env={FLAGS.env!r} is not a custom_envs tag of this config; tags: "
             f"{', '.join(tags)}")
  manager = local_manager(config, FLAGS.env, "human" if FLAGS.policy == "human" else None,
                          val=FLAGS.val, on_turn=print_turn)
  for episode in range(FLAGS.episodes):
    seed = FLAGS.seed + episode
    ticket = Ticket(0, FLAGS.env, 0, episode, seed)
    print(f"===== {FLAGS.env} episode {episode} (seed {seed}) =====")
    traj = asyncio.run(manager.run_episode(ticket))
    print(f"===== score {traj.score:+.2f}, success {traj.success}, {traj.num_turns} turns, "
          f"{traj.num_invalid_actions} invalid, {traj.num_ineffective_actions} ineffective, "
          f"ended: {traj.finish} =====")


if __name__ == "__main__":
  # flags only when run as a script: tests import local_manager beside rollx.eval, whose
  # --episodes and --seed would clash
  flags.DEFINE_string("env", None, "the custom_envs tag to play, e.g. FrozenLake")
  flags.DEFINE_enum("policy", "model", ["model", "human"], "who answers each turn")
  flags.DEFINE_integer("episodes", 1, "episodes to play")
  flags.DEFINE_integer("seed", 0, "level seed of the first episode")
  flags.DEFINE_bool("val", False, "use validation sampling (actor_infer.val_generating_args)")
  flags.mark_flag_as_required("env")
  app.run(main, flags_parser=cli.parse_flags)
