"""Entry point: debug the multi-turn loop with one env, in-process (no Ray, no server).

    python -m rollx.play --config=configs/frozenlake.py --env=FrozenLake [--policy=model|human]

Runs the same `EnvManager.run_episode` the training rollouts run, with the policy
given by `--policy`: `model` decodes locally with the config's model (`pretrain`,
or the built-in default) and actor_infer's sampling (validation sampling with
--val); `human` reads each response from standard input. Every turn prints the
prompt text the model sees, the response, the parsed action and the reward.
"""

from __future__ import annotations

import asyncio
import sys
from typing import List

from absl import app, flags
import jax

from rollx import cli, models
from rollx.models import hf, llm
from rollx.rollout.env_manager import EnvManager
from rollx.rollout.types import Ticket
from rollx.serving.client import Generation

_ENV = flags.DEFINE_string("env", None, "the custom_envs tag to play, e.g. FrozenLake")
_POLICY = flags.DEFINE_enum("policy", "model", ["model", "human"], "who answers each turn")
_EPISODES = flags.DEFINE_integer("episodes", 1, "episodes to play")
_SEED = flags.DEFINE_integer("seed", 0, "level seed of the first episode")
_VAL = flags.DEFINE_bool("val", False, "use validation sampling (actor_infer.val_generating_args)")


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


def print_turn(manager: EnvManager, record: dict) -> None:
  tok = manager.tokenizer
  print(f"----- turn {record['turn']} -----\n[prompt]\n{tok.decode(record['prompt_ids'])}")
  print(f"[response] {record['response']!r}\n[action] {record['action'] or 'INVALID'}"
        f"   [reward] {record['reward']:+.2f}", flush=True)


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  tags = list(config.custom_envs.keys())
  if _ENV.value not in tags:
    cli.fail(f"--env={_ENV.value!r} is not a custom_envs tag of this config; tags: "
             f"{', '.join(tags)}")
  tokenizer = hf.load_tokenizer(models.resolve_model_dir(config.pretrain))
  if _POLICY.value == "human":
    policy = Human(tokenizer)
  else:
    g = config.actor_infer.val_generating_args if _VAL.value else config.actor_infer.generating_args
    policy = LocalModel(config, g.temperature)
  manager = EnvManager(0, _ENV.value, config.custom_envs[_ENV.value].to_dict(), tokenizer,
                       policy, mode="val" if _VAL.value else "train",
                       sequence_length=config.sequence_length, on_turn=print_turn,
                       step_wise=config.train_env_manager.env_manager_type == "step",
                       history_length=config.train_env_manager.history_length)
  for episode in range(_EPISODES.value):
    seed = _SEED.value + episode
    ticket = Ticket(0, _ENV.value, 0, episode, seed)
    print(f"===== {_ENV.value} episode {episode} (seed {seed}) =====")
    traj = asyncio.run(manager.run_episode(ticket))
    print(f"===== score {traj.score:+.2f}, success {traj.success}, {traj.num_turns} turns, "
          f"{traj.num_invalid_actions} invalid, ended: {traj.finish} =====")


if __name__ == "__main__":
  flags.mark_flag_as_required("env")
  app.run(main, flags_parser=cli.parse_flags)
