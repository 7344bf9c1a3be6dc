"""Warm start: pretraining on random-play transcripts; format, and nothing about the task.

    python -m rollx.recipes.warm_start --config=configs/sokoban.py \
        --config.warm_start_steps=200 --out=DIR [--config.KEY=VALUE ...]

writes the config's warm start (`build`) to DIR, an HF model directory that
`--config.pretrain=DIR --config.warm_start_steps=0` starts RL from, as big_vision takes
`model_init`. A run with `warm_start_steps` > 0 builds it itself before its pipeline
(`prepare`, in output_dir/warm_start), once: a later run of the same recipe reuses it.

Real runs start RL from an instruct model that already answers in the requested
format; a randomly initialised model never emits `<answer>Right</answer>` by chance,
so RL from scratch would have no signal at all. This script stands in for
pretraining + instruction tuning, honestly: it runs real episodes of the envs through
the same `EnvManager` loop and prompt templates the rollouts use, but every response
is a uniformly random valid action (`env.sample_valid_response`), independent of the
observation, and trains next-token prediction on the whole transcript:
- on the observations (pretraining on env text): the model learns to read a board
  (rows, columns, where P and G stand), as a pretrained LLM has read grids before.
  Without it, RL must discover 2-D positions from a sparse reward through RoPE
  attention alone: in a throwaway probe (supervised BFS-optimal moves, same model)
  the answers-only warm start was still at chance (0.35) after 12.8k labels and at
  0.74 after 25.6k; after next-token pretraining on observations, 0.77 after 12.8k;
- on the responses: the answer format, when to stop (EOS after the closing tag) and
  a uniform action distribution.
In multi-turn transcripts (Sokoban; FrozenLake, also cut step-wise) the next
observation follows the action, so the model also sees how a move changes the board
(the rules, as any text about the game shows them). No reward and no
action that depends on the board is ever seen: any task skill the model shows after
RL was learned by RL.

`WARM_START_ENVS` lists the envs and templates the shipped default model is warm
started on (those of configs/frozenlake.py and configs/sokoban.py; rollx.recipes.make_default).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
from typing import Callable, List, Optional, Sequence

from absl import app, flags
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

import envs
from rollx import cli
from rollx import config as rollx_config
from rollx import models
from rollx.models import hf, llm, logprobs
from rollx.parallel import mesh as mesh_lib
from rollx.recipes import tool_demos
from rollx.rollout import prompts
from rollx.rollout.agent_loops import make_agent_loop
from rollx.rollout.env_worker import manager_kwargs
from rollx.rollout.types import Ticket, Trajectory, collate
from rollx.trainer import packing
from rollx.trainer.step import Trainer

SEQUENCE_LENGTH = 512
# The FrozenLake observation of configs/frozenlake.py: the grid and the line naming the
# tiles next to P (`show_neighbours`); predicting that line from the grid is perception
# pretraining too (where P's neighbours sit in the flattened grid), no task signal.
_FROZENLAKE = rollx_config.env_entry(
    "FrozenLake", env_config=dict(size=4, p=0.8, is_slippery=False, max_steps=10,
                                  show_neighbours=True),
    max_tokens_per_step=12, **prompts.COMPACT_PROMPTS["FrozenLake"])  # room for a think
# (tag, env entry, EnvManager options, share of the episodes): the prompts the default
# model must read and answer in format, cut into samples the way its configs cut them
# (configs/frozenlake.py: history-free step-wise; Sokoban as whole conversations, as
# configs/sokoban.py:multiturn cuts them: a step sample of the other Sokoban configs
# is a conversation's first turn with a later board).
# FrozenLake also as whole conversations: there the next board follows each random
# move, so the model reads how a move changes a board (the rules, as text about the
# game shows them; a history-free step sample is a lone board). With them, RL on
# random maps took off after ~7-8k episodes instead of ~17-21k (2 seeds each, GPU
# simulator of the step-wise GRPO loop; 8-19k on a second build).
def warm_start_envs(sokoban_neighbours: bool = True) -> tuple:
  """The warm start's (tag, env entry, EnvManager options, share) list.

  `sokoban_neighbours`: SimpleSokoban's transcripts carry the neighbour line
  (`SokobanConfig.show_neighbours`), as configs/simple_sokoban.py and
  configs/sokoban.py show it. The shipped default model is built with it: a model
  that never saw the line answers boards that carry it with more board text (~40%
  invalid answers, measured 2026-11-26). False rebuilds the earlier recipe (`python -m rollx.recipes.make_default --nosokoban_neighbours --out_dir=DIR`).
  """
  sokoban = rollx_config.env_entry(
      "Sokoban", env_config=dict(dim_room=(6, 6), num_boxes=1, search_depth=30, max_steps=10,
                                 show_neighbours=sokoban_neighbours),
      max_tokens_per_step=8, **prompts.COMPACT_PROMPTS["Sokoban"])
  return (
      ("FrozenLake", _FROZENLAKE, dict(step_wise=True, history_length=0), 0.45),
      ("FrozenLakeMultiTurn", _FROZENLAKE, {}, 0.30),
      ("SimpleSokoban", sokoban, {}, 0.25),
  )


WARM_START_ENVS = warm_start_envs()


@dataclasses.dataclass
class _Generated:
  token_ids: List[int]
  token_versions: List[int]
  policy_version: int = -1


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def think_response(env, answer: str) -> str:
  """`answer` after a think of what lies next to P (`env.neighbours()`, e.g. `_O#G` for
  Left, Down, Right, Up): perception of the current state, then a random answer."""
  return f"{THINK_OPEN}{env.neighbours()}{THINK_CLOSE}{answer}"


def random_valid_episodes(tokenizer, entries: Sequence[tuple], num_episodes: int,
                          seed: int, sequence_length: int = SEQUENCE_LENGTH,
                          think_tags: Sequence[str] = (),
                          policy: Optional[Callable] = None) -> List[Trajectory]:
  """Episodes of the real env loop whose every answer is a random valid action.

  For the tags in `think_tags` each response first thinks what lies next to P
  (`think_response`); the answer stays uniformly random. `policy(env, rng) -> answer`
  replaces the uniform choice (`env.sample_valid_response`) by another random policy
  that reads no goal (envs.webshop.shopper_response).
  """
  rng = np.random.default_rng(seed)
  trajectories = []
  for k, (tag, entry, manager_args, share) in enumerate(entries):
    think = tag in think_tags
    if think and not hasattr(envs.env_class(entry["env_type"]), "neighbours"):
      raise ValueError(f"warm start think_tags: env {entry['env_type']!r} (tag {tag!r}) has no "
                       f"neighbours() to think about")
    running = []  # the manager below, whose env is the one being played

    async def generate(request_id, prompt_ids, max_tokens, think=think, running=running, **_):
      # uniform over the valid actions of the page being played (the grid games': all
      # moves, whatever the board), or `policy`'s random choice: no task signal
      env = running[0].env
      text = env.sample_valid_response(rng) if policy is None else policy(env, rng)
      if think:
        text = think_response(env, text)
      ids = list(tokenizer.encode(text, add_special_tokens=False)) + [tokenizer.eos_token_id]
      return _Generated(ids[:max_tokens], [-1] * min(len(ids), max_tokens))

    if entry.get("agent_loop") == "program":  # the env's own turns: no program, no server
      entry = dict(entry, agent_loop="game", agent_program="")
    manager = make_agent_loop(k, tag, entry, tokenizer, generate, sequence_length=sequence_length,
                              **manager_args)
    running.append(manager)
    for i in range(round(num_episodes * share)):
      ticket = Ticket(env_id=k, tag=tag, group_id=i, generation=0,
                      seed=int(rng.integers(2**31)))
      trajectories.append(asyncio.run(manager.run_episode(ticket)))
  return trajectories


def _lm_loss(model, params, batch, rng):
  """Next-token loss on every token of the transcript (observations and answers);
  log-probs are 0 where nothing is predicted (a segment's first token, padding)."""
  logp, _ = logprobs.compute_logprobs(model, params, batch["input_ids"], batch["segment_ids"])
  mask = batch["loss_mask"]
  nll = -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  return nll, {"nll": nll}


def loss_mask(samples, responses_only=False) -> np.ndarray:
  """[N, T] 1.0 where the warm start's loss predicts a token: every token of a transcript
  but each sample's first, or the policy's tokens alone. `responses_only`: True or False
  for every row, or the tags whose rows learn their responses alone (a mix of tool
  demonstrations and game transcripts trains each its own way)."""
  if isinstance(responses_only, bool):
    rows = np.full(len(samples.tags), responses_only)
  else:
    rows = np.isin(np.asarray(samples.tags, dtype=object), list(responses_only))
  # Tool demonstrations: a few dozen answer tokens after a constant system prompt of
  # several hundred tokens, which would otherwise own the loss while the calls stay unlearned.
  predicted = np.where(rows[:, None], samples.response_mask,
                       samples.segment_ids).astype(np.float32)
  predicted[:, 0] = 0.0  # each sample's first token has no prediction
  return predicted


def warm_start(model_dir: str, steps: int = 100, batch_size: int = 16, learning_rate: float = 2e-3,
               seed: int = 0, entries=WARM_START_ENVS, log_every: int = 50,
               think_tags: Sequence[str] = (), sequence_length: int = SEQUENCE_LENGTH,
               num_episodes: Optional[int] = None,
               episodes: Optional[List[Trajectory]] = None,
               responses_only=False) -> dict:
  """Trains the model in `model_dir` in place on random-valid-answer episodes
  (`num_episodes`, default steps x batch_size: one per row the steps read), or on
  `episodes` when given; the loss covers every token of a transcript, or the policy's
  tokens alone on the rows `responses_only` names (`loss_mask`)."""
  loaded = models.load_model(model_dir)
  tokenizer = hf.load_tokenizer(model_dir)
  worker = rollx_config.default_config().actor_train
  worker.training_args.update(learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                              warmup_steps=max(1, steps // 10), lr_scheduler_type="cosine")
  worker.strategy_args.update(dp_size=1)
  worker.device_mapping = (0,)  # one device: the mesh must not ask for more than it has
  worker.model_args.disable_gradient_checkpointing = True  # small model: memory is no issue
  mesh = mesh_lib.make_mesh(worker.strategy_args, worker.device_mapping, "warm_start")
  trainer = Trainer(loaded.config, worker, mesh, _lm_loss, steps)
  state = trainer.init_state(jax.device_get(loaded.params))
  # Packed rows (rollx.trainer.packing): random episodes are short, padding would
  # be most of the compute.
  if episodes is None:
    episodes = random_valid_episodes(tokenizer, entries, num_episodes or steps * batch_size,
                                     seed, sequence_length, think_tags=think_tags)
  samples = collate(episodes, sequence_length)
  plan = packing.plan(samples.segment_ids.sum(axis=1), sequence_length, batch_size)
  predicted = loss_mask(samples, responses_only)
  data = {"input_ids": plan.pack(samples.input_ids), "segment_ids": plan.segment_ids(),
          "loss_mask": plan.pack(predicted)}
  order = np.random.default_rng(seed).permutation(plan.num_rows)
  rng = jax.random.PRNGKey(seed)
  metrics = {}
  for step in range(steps):
    rows = order[np.arange(step * batch_size, (step + 1) * batch_size) % len(order)]
    batch = trainer.batch_sharding({k: jnp.asarray(v[rows]) for k, v in data.items()})
    rng, key = jax.random.split(rng)
    state, metrics = trainer.update(state, batch, key)
    if log_every and (step % log_every == 0 or step == steps - 1):
      print(f"warm start step {step}: nll {float(metrics['nll']):.4f}", flush=True)
  # weights only: re-saving a loaded tokenizer would rewrite its files (normalizer)
  hf.save_pretrained(jax.device_get(state.params), loaded.config, model_dir)
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def train_entries(config) -> tuple:
  """`config`'s training envs as `random_valid_episodes` entries: (tag, env entry, the
  train env manager's step-wise cut, an equal share of the episodes)."""
  kwargs = manager_kwargs(config, "train_env_manager")
  cut = dict(step_wise=kwargs["step_wise"], history_length=kwargs["history_length"])
  tags = tuple(config.train_env_manager.tags)
  return tuple((tag, config.custom_envs[tag].to_dict(), dict(cut), 1.0 / len(tags))
               for tag in tags)


RECORD = "rollx_warm_start.json"  # what a built start was built from, beside its weights


def recipe(config) -> dict:
  """Everything `build` reads from `config`: a start built from the same recipe is
  reused, one built from another is rebuilt."""
  kwargs = manager_kwargs(config, "train_env_manager")
  return json.loads(json.dumps({"pretrain": os.path.abspath(models.resolve_model_dir(config.pretrain)),
          "warm_start_steps": int(config.warm_start_steps),
          "warm_start_responses_only": bool(config.warm_start_responses_only),
          "seed": int(config.seed), "sequence_length": int(config.sequence_length),
          "step_wise": bool(kwargs["step_wise"]),
          "history_length": int(kwargs["history_length"]),
          "envs": {tag: config.custom_envs[tag].to_dict()
                   for tag in config.train_env_manager.tags}}))  # as read back


def _recorded(model_dir: str):
  try:
    with open(os.path.join(model_dir, RECORD)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_demo_families(config) -> None:
  """RL on a tool env must be measured on task families the demonstrations do not use."""
  for tag in config.train_env_manager.tags:
    entry = config.custom_envs[tag]
    overlap = tool_demos.demo_families_overlap(entry.env_config.get("datasets", ()))
    if entry.get("agent_loop") in rollx_config.TOOL_LOOPS and entry.get("tools") and overlap:
      raise ValueError(f"custom_envs.{tag}.env_config.datasets: {overlap} are the tool "
                       "demonstrations' families; RL must be measured on others")


def build(config, out_dir: str, record: bool = True) -> str:
  """The warm start of `config` (`warm_start_steps` > 0) in `out_dir`: a copy of
  `pretrain` trained on random-valid-action transcripts of the train envs, cut into
  samples as the train env manager cuts them (an equal share of episodes per tag); envs
  with tools (tool loop or agent program) get solved tool-use demonstrations of the tool
  loop on other task families instead (rollx.recipes.tool_demos). With `record`, the
  recipe (`recipe`) is written beside the weights and a directory already built from
  the same recipe is reused as it is; without, `out_dir` is replaced (a model that
  ships)."""
  if not config.warm_start_steps:
    raise ValueError("--config.warm_start_steps: must be > 0 for a warm start "
                     "(e.g. --config.warm_start_steps=200)")
  out_dir = os.path.abspath(out_dir)
  wanted = recipe(config)
  if record and _recorded(out_dir) == wanted:
    return out_dir
  if record and _recorded(out_dir) is None and os.path.isdir(out_dir) and os.listdir(out_dir):
    raise ValueError(f"{out_dir} exists and is not a warm start: name a new directory")
  check_demo_families(config)
  tmp = f"{out_dir}.tmp{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(models.resolve_model_dir(config.pretrain), tmp)
  kwargs = manager_kwargs(config, "train_env_manager")
  tags = tuple(config.train_env_manager.tags)
  entries = train_entries(config)
  # enough episodes for the rows the steps read (16 a step): a step-wise episode of random
  # actions gives about half its env's max_steps samples
  rows = config.warm_start_steps * 16
  if kwargs["step_wise"]:
    max_steps = max(envs.make_env_config(config.custom_envs[t].env_type,
                                         config.custom_envs[t].env_config.to_dict()).max_steps
                    for t in tags)
    rows = -(-rows // max(1, max_steps // 2))
  tokenizer = hf.load_tokenizer(tmp)
  episodes = []
  for k, (tag, entry, manager_args, share) in enumerate(entries):
    n = max(1, round(rows * share))
    if entry.get("agent_loop") in rollx_config.TOOL_LOOPS and entry.get("tools"):
      episodes += tool_demos.demonstration_episodes(tokenizer, entry, n, config.seed + k,
                                                    config.sequence_length)
      # as many copy samples beside them, opening as this loop's episodes do:
      # demonstrations alone (2-4 positive terms) teach the calls of their own shape and
      # wear the general copy skill down
      episodes += tool_demos.copy_episodes(tokenizer, n, config.seed + 1000 + k, entry=entry,
                                           sequence_length=config.sequence_length)
    else:
      episodes += random_valid_episodes(tokenizer, [(tag, entry, manager_args, 1.0)], n,
                                        config.seed + k, config.sequence_length)
  answers_only = (tool_demos.DEMO_TAG, tool_demos.COPY_TAG)
  if config.warm_start_responses_only:
    answers_only += tags
  warm_start(tmp, steps=config.warm_start_steps, seed=config.seed, entries=entries,
             sequence_length=config.sequence_length, episodes=episodes,
             log_every=max(1, config.warm_start_steps // 4), responses_only=answers_only)
  if record:
    with open(os.path.join(tmp, RECORD), "w") as f:
      json.dump(wanted, f, indent=1, sort_keys=True)
  shutil.rmtree(out_dir, ignore_errors=True)  # another recipe's start, or the shipped one
  os.replace(tmp, out_dir)  # whole or absent: a run killed mid-way builds it again
  return out_dir


def build_and_say(config, out_dir: str) -> str:
  """`build`, then one line: built (steps, seconds) or reused."""
  reused = _recorded(os.path.abspath(out_dir)) == recipe(config)
  start = time.perf_counter()
  out_dir = build(config, out_dir)
  print(f"warm start: {'reused' if reused else 'built'} {out_dir}"
        + ("" if reused else f" ({config.warm_start_steps} steps, "
                              f"{time.perf_counter() - start:.0f} s)"), flush=True)
  return out_dir


def run_dir(config) -> str:
  """Where a run with `warm_start_steps` > 0 keeps its start: output_dir/warm_start."""
  return os.path.join(config.output_dir, "warm_start")


def prepare(config, build_missing: bool = True) -> None:
  """Points `pretrain` at the run's warm start when `warm_start_steps` > 0: the one place
  rollx.train (before it builds the pipeline), rollx.play and rollx.eval resolve it.
  rollx.train builds it when missing or built from another recipe (`build_missing`);
  play and eval use a built one and otherwise the config's `pretrain`. In a multi-host
  run process 0 builds it while the others wait, then every host loads it (output_dir
  must be on storage every host sees, as checkpoints are)."""
  if not config.warm_start_steps:
    return
  target = run_dir(config)
  if not build_missing:
    if _recorded(target) == recipe(config):
      config.pretrain = target
    return
  if jax.process_index() == 0:
    build_and_say(config, target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("rollx warm start built")
    if _recorded(target) != recipe(config):
      raise ValueError(f"output_dir: process 0 built the warm start in {target}, which this "
                       f"host (process {jax.process_index()}) does not see; put output_dir "
                       "on storage every host shares")
  config.pretrain = target


def format_rate(model_dir: str, entries=WARM_START_ENVS, num_prompts: int = 32,
                seed: int = 1) -> float:
  """Share of sampled (temperature 1) first answers that parse as a valid action."""
  loaded = models.load_model(model_dir)
  tokenizer = hf.load_tokenizer(model_dir)
  rng = jax.random.PRNGKey(seed)
  valid = total = 0
  for tag, entry, _, _ in entries:
    env = envs.make_env(entry["env_type"], dict(entry["env_config"]))
    builder = prompts.builder_for(entry, env, tokenizer)
    for i in range(num_prompts):
      obs, _ = env.reset(seed=seed * 100003 + i)
      rng, key = jax.random.split(rng)
      out = llm.generate(loaded.model, loaded.params, builder.first_prompt(obs, env.actions_left),
                         int(entry["max_tokens_per_step"]), tokenizer.eos_token_id,
                         temperature=1.0, rng=key)
      text = tokenizer.decode(out, skip_special_tokens=True)
      valid += env.parse(text) is not None
      total += 1
  return valid / total


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  try:
    out = build_and_say(config, FLAGS.out)
  except ValueError as e:
    cli.fail(str(e))
  print(f"start RL from it: --config.pretrain={out} --config.warm_start_steps=0")


if __name__ == "__main__":
  # flags only when run as a script: importing this module must not claim flag names
  FLAGS = flags.FLAGS
  flags.DEFINE_string("out", None, "the model directory to write (an HF directory that "
                      "--config.pretrain takes)")
  flags.mark_flag_as_required("out")
  app.run(main, flags_parser=cli.parse_flags)
