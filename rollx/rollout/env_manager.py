"""One env and its own multi-turn loop (`run_rollout_loop`); no barrier with other envs.

    ticket = scheduler.next_ticket(env_id)     # which level (seed), which group generation
    obs = env.reset(seed)
    loop: prompt ids -> generate (JetStream, via the rollout client) -> response ids
          -> text -> env.step -> reward, next obs -> continuation ids ...
    scheduler.put(trajectory)

Two ways to cut a trajectory into training samples:
- trajectory-wise (StarPO): one sample, the whole conversation; response_mask 1
  exactly on the ids the model produced; the episode score is its reward;
- step-wise (GiGPO): one sample per env step: instructions + the last
  `history_length` steps + this observation, then the response; reward = the
  step's env reward; tagged with a hash of the observation (anchor state).
  With `symmetric_views` (grid envs, training only) each step also yields the same
  decision seen through board symmetries (`Trajectory.views`): the observation
  turned or mirrored, the move in the response relabelled, the same rewards. Over
  a decision and its views the reinforced moves balance (rot180 pairs Left with
  Right and Up with Down), and the hole and wall lessons of one board reach its
  symmetric twins. The views are not the policy's own samples: their log-probs come
  from the trainer's pass like any row (so they count in the trust region's KL),
  they carry no behaviour log-probs (rollout correction leaves them unweighted),
  and they add no episodes to the metrics. On FrozenLake they did not steady greedy
  validation (docs/frozenlake_recipe.md).

`generate` is any async callable with the RolloutClient's signature, so the same
loop runs against JetStream servers (training), a local model or a person typing
(`rollx.play`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence

import ml_collections

import envs
from rollx import config as config_lib
from rollx.config_check import Checker, did_you_mean, is_int
from rollx.rollout import prompts
from rollx.rollout.types import Sample, Ticket, Trajectory, oldest_response_version


class PromptTooLongError(ValueError):
  """An episode's first prompt does not fit: every episode would end before the model
  acts, so this is a config error, not an env error to retry."""


# Errors no re-run of the episode can fix: the loop reports them and stops.
FATAL_ERRORS = ("NoServerAliveError", "InvalidRequestError", "PromptTooLongError")

NAN = math.nan
GenerateFn = Callable[..., Awaitable[Any]]  # (request_id, prompt_ids, max_tokens, *, trajectory_id, mode)


class EnvManager:

  def __init__(self, env_id: int, tag: str, entry, tokenizer, generate: GenerateFn, *,
               mode: str = "train", sequence_length: int = 1024,
               max_prompt_length: Optional[int] = None, step_wise: bool = False,
               history_length: int = 2, render: bool = False, on_turn=None,
               symmetric_views: Sequence[str] = (), max_new_tokens: Optional[int] = None,
               end_trajectory: Optional[Callable[[str], Awaitable[None]]] = None):
    self.env_id, self.tag, self.entry = env_id, tag, entry
    self.env_type = entry["env_type"]
    self.env_config = dict(entry["env_config"])
    self.env = envs.make_env(self.env_type, self.env_config)
    self.tokenizer, self.generate, self.mode = tokenizer, generate, mode
    # told when an episode ends, so the server can drop its cached keys/values
    # (RolloutClient.end_trajectory)
    self.end_trajectory = end_trajectory
    # a turn's cap: the env's max_tokens_per_step, and the sampling's max_new_tokens
    self.max_tokens = min(int(entry["max_tokens_per_step"]), int(max_new_tokens or 1 << 30))
    self.sequence_length = int(sequence_length)
    self.max_prompt_length = int(max_prompt_length or sequence_length)
    self.step_wise, self.history_length = step_wise, int(history_length)
    self.render, self.on_turn = render, on_turn
    self.builder = prompts.builder_for(entry, self.env, tokenizer, self.max_tokens)
    self.num_env_errors = 0
    self.symmetric_views = tuple(symmetric_views)
    unsupported = [v for v in self.symmetric_views if v not in self.env.SYMMETRIES]
    if unsupported or (self.symmetric_views and not step_wise):
      raise ValueError(
          f"symmetric_views {unsupported or list(self.symmetric_views)}: env {tag!r} "
          f"({self.env_type}) supports {list(self.env.SYMMETRIES) or 'none'}, and views "
          f"need step-wise samples (env_manager_type='step')")

  # -- the loop ----------------------------------------------------------------------
  async def run_rollout_loop(self, scheduler) -> None:
    """Runs episodes for tickets from `scheduler` until it hands out None."""
    while True:
      ticket = await scheduler.next_ticket(self.env_id)
      if ticket is None:
        return
      try:
        try:
          trajectory = await self.run_episode(ticket)
        finally:
          await self._ended(ticket)
      except asyncio.CancelledError:
        raise
      except Exception as e:  # noqa: BLE001 - env code is user code; never crash the loop
        if type(e).__name__ in FATAL_ERRORS:
          # not the env's fault: the rollout system itself is broken or misconfigured
          await scheduler.fail(f"env {self.env_id} ({self.tag}): {type(e).__name__}: {e}")
          raise
        self.num_env_errors += 1
        logging.warning("env %d (%s) raised on ticket %s: %r; resetting it", self.env_id,
                        self.tag, ticket, e)
        self.env = envs.make_env(self.env_type, self.env_config)
        await scheduler.report_error(ticket, f"{type(e).__name__}: {e}")
        continue
      await scheduler.put(trajectory)

  async def _ended(self, ticket: Ticket) -> None:
    """Tells the server the episode ended; a failure to tell costs only cache room (the
    server evicts what is never continued), so it never fails the episode."""
    if self.end_trajectory is None:
      return
    try:
      await self.end_trajectory(self.trajectory_key(ticket))
    except Exception as e:  # noqa: BLE001 - best effort, see above
      logging.debug("env %d: end_trajectory failed: %r", self.env_id, e)

  # -- one episode ---------------------------------------------------------------------
  def trajectory_key(self, ticket: Ticket) -> str:
    """The id the servers know the episode's conversation by (sticky routing, KV reuse)."""
    return f"{self.tag}/g{ticket.group_id}/n{ticket.generation}/e{self.env_id}"

  def _request_id(self, ticket: Ticket, turn: int) -> str:
    return f"{self.tag}/g{ticket.group_id}/n{ticket.generation}/e{self.env_id}/t{turn}"

  async def run_episode(self, ticket: Ticket) -> Trajectory:
    env, b = self.env, self.builder
    obs, _ = env.reset(seed=ticket.seed)
    frames = [env.render("rgb_array")] if self.render else []
    traj_key = self.trajectory_key(ticket)
    ids: List[int] = []
    mask: List[int] = []
    versions: List[int] = []
    behaviour: List[float] = []  # per id: the server's sampling log-prob (NaN: none)
    samples: List[Sample] = []
    history: List[Dict[str, Any]] = []
    views: Dict[str, List[Sample]] = {v: [] for v in self.symmetric_views}
    view_history: Dict[str, List[Dict[str, Any]]] = {v: [] for v in self.symmetric_views}
    transcript: List[Dict[str, Any]] = []
    score, turn, finish, info = 0.0, 0, "", {"success": False, "num_invalid_actions": 0}
    prompt = b.first_prompt(obs, env.actions_left)
    while True:
      turn += 1
      if self.step_wise:
        prompt = b.step_prompt(obs, turn, env.actions_left, history, self.history_length)
        ids, mask, versions, behaviour = [], [], [], []
      budget = min(self.max_tokens, self.sequence_length - len(ids) - len(prompt))
      if budget < 1 or len(ids) + len(prompt) > self.max_prompt_length:
        if turn == 1:
          raise PromptTooLongError(
              f"the first prompt of env {self.tag!r} is {len(prompt)} tokens; it must fit "
              f"actor_infer.strategy_args.max_prefill_length ({self.max_prompt_length}) and "
              f"leave room for a response within min(sequence_length, "
              f"actor_infer.strategy_args.max_cache_length) ({self.sequence_length})")
        finish = "length"
        break
      ids += prompt
      mask += [0] * len(prompt)
      versions += [-1] * len(prompt)
      behaviour += [NAN] * len(prompt)
      gen, response, text = await self._respond(ticket, turn, traj_key, budget, ids, mask,
                                                versions, behaviour)
      acted_on, actions_left = obs, env.actions_left
      if hasattr(env, "astep"):  # envs that wait on I/O (tools, web) step asynchronously
        obs, reward, terminated, truncated, info = await env.astep(text)
      else:
        obs, reward, terminated, truncated, info = env.step(text)
      score += reward
      record = {"turn": turn, "prompt_ids": list(prompt), "response_ids": response,
                "response": text, "action": info["action"], "reward": reward,
                "valid": info["action_is_valid"], "kind": info.get("action_kind"),
                "observation": acted_on}
      transcript.append(record)
      if self.on_turn is not None:
        self.on_turn(self, record)
      if self.render:
        frames.append(env.render("rgb_array"))
      if self.step_wise:
        samples.append(Sample(list(ids), list(mask), list(versions), float(reward),
                              step_index=turn - 1, anchor=prompts.observation_hash(acted_on),
                              behaviour_logp=list(behaviour)))
        for view in self.symmetric_views:
          views[view].append(self._view_sample(
              view, acted_on, info["action"], text, response, gen, turn, view_history[view],
              reward, actions_left))
        history.append({"turn_idx": turn, "observation": acted_on,
                        "action": info["action"] or text.strip()[:32], "reward": reward})
      if terminated or truncated:
        finish = "terminated" if terminated else "truncated"
        break
      if not self.step_wise:
        prompt = b.continuation(obs, turn + 1, env.actions_left, response)
    if not self.step_wise and mask:
      samples = [Sample(ids, mask, versions, float(score), behaviour_logp=behaviour)]
    return Trajectory(
        ticket=ticket, samples=samples, score=float(score), success=bool(info["success"]),
        num_turns=len(transcript), num_invalid_actions=int(info.get("num_invalid_actions", 0)),
        num_ineffective_actions=int(info.get("num_ineffective_actions", 0)),
        finish=finish, start_version=oldest_response_version(samples),
        transcript=transcript, frames=frames, views=views)

  async def _respond(self, ticket: Ticket, turn: int, traj_key: str, budget: int,
                     ids: List[int], mask: List[int], versions: List[int],
                     behaviour: List[float]):
    """One response to the sequence `ids`: generated, then appended in place to the
    sample's ids, response mask (1), policy versions and behaviour log-probs (NaN when
    the server sent none). Returns (generation, response ids, decoded text)."""
    gen = await self.generate(self._request_id(ticket, turn), list(ids), budget,
                              trajectory_id=traj_key, mode=self.mode)
    response = list(gen.token_ids)
    ids += response
    mask += [1] * len(response)
    versions += list(gen.token_versions) or [gen.policy_version] * len(response)
    logp = list(getattr(gen, "behaviour_logp", None) or ())
    behaviour += logp if len(logp) == len(response) else [NAN] * len(response)
    return gen, response, self.tokenizer.decode(response, skip_special_tokens=True)

  def _view_sample(self, view: str, observation: str, action: Optional[str], text: str,
                   response: List[int], gen, turn: int, history: List[Dict[str, Any]],
                   reward: float, actions_left: int) -> Sample:
    """The step's decision seen through board symmetry `view` (see the module doc)."""
    seen, moved = self.env.symmetric_view(observation, action, view)
    prompt = self.builder.step_prompt(seen, turn, actions_left, history, self.history_length)
    if moved is None:  # an invalid answer is invalid on any board: the same ids
      response_ids = list(response)
    else:
      response_ids = self.builder.encode(
          envs.parsing.replace_action(text, moved, self.env.config.action_pattern))
      if response and response[-1] == self.builder.eos_id:
        response_ids.append(self.builder.eos_id)
    history.append({"turn_idx": turn, "observation": seen,
                    "action": moved or text.strip()[:32], "reward": reward})
    return Sample(prompt + response_ids, [0] * len(prompt) + [1] * len(response_ids),
                  [-1] * len(prompt) + [gen.policy_version] * len(response_ids), float(reward),
                  step_index=turn - 1, anchor=prompts.observation_hash(seen))


# -- config checks (called by rollx.checks) -------------------------------------------


def check_env_managers(c: Checker, cfg) -> None:
  """train_env_manager / val_env_manager: sizes, tags and their partition, sample kind,
  symmetric views; and the batch sizes that must hold whole groups."""
  for name in config_lib.ENV_MANAGERS:
    m = cfg[name]
    if not isinstance(m, (ml_collections.ConfigDict, dict)):
      continue
    for key in ("max_env_num_per_worker", "num_env_groups", "group_size"):
      if is_int(m[key]):
        c.rule(m[key] >= 1, f"{name}.{key}", f"must be >= 1, got {m[key]}")
    for key in ("history_length", "group_size_redundancy"):
      if is_int(m[key]):
        c.rule(m[key] >= 0, f"{name}.{key}", f"must be >= 0, got {m[key]}")
    c.choice(m, "env_manager_type", f"{name}.env_manager_type", config_lib.ENV_MANAGER_TYPES)
    _check_symmetric_views(c, cfg, name)
    if isinstance(m.group_filter_ratio, float):
      c.rule(0 < m.group_filter_ratio <= 1, f"{name}.group_filter_ratio",
             f"must be in (0, 1], got {m.group_filter_ratio}")
    tags = m.tags
    if not isinstance(tags, tuple):
      continue
    c.rule(len(tags) > 0, f"{name}.tags", "must name at least one custom_envs entry")
    for tag in tags:
      if tag not in cfg.custom_envs:
        c.error(f"{name}.tags", f"tag {tag!r} has no custom_envs entry"
                f"{did_you_mean(str(tag), cfg.custom_envs.keys())}; "
                f"custom_envs has: {', '.join(cfg.custom_envs.keys()) or 'nothing'}")
      elif (cfg.custom_envs[tag].get("agent_loop") in config_lib.TOOL_LOOPS
            and m.env_manager_type != "trajectory"):
        c.error(f"{name}.env_manager_type", f"tag {tag!r} runs agent_loop "
                f"{cfg.custom_envs[tag].get('agent_loop')!r}, whose episodes are "
                "conversations: needs 'trajectory'")
    part = m.num_groups_partition
    if part is not None and is_int(m.num_env_groups):
      if len(part) != len(tags):
        c.error(f"{name}.num_groups_partition",
                f"has {len(part)} entries but tags has {len(tags)}")
      elif not all(is_int(p) and p >= 0 for p in part):
        c.error(f"{name}.num_groups_partition", f"must be ints >= 0, got {part}")
      elif sum(part) != m.num_env_groups:
        c.error(f"{name}.num_groups_partition",
                f"sums to {sum(part)}, but num_env_groups is {m.num_env_groups}")
    elif is_int(m.num_env_groups) and tags:
      c.rule(m.num_env_groups >= len(tags), f"{name}.num_env_groups",
             f"{m.num_env_groups} groups cannot cover {len(tags)} tags")
  gs = cfg.train_env_manager.group_size
  if is_int(gs) and is_int(cfg.rollout_batch_size) and gs >= 1:
    c.rule(cfg.rollout_batch_size % gs == 0, "rollout_batch_size",
           f"{cfg.rollout_batch_size} is not a multiple of train_env_manager.group_size={gs}"
           " (batches hold whole groups)")
  c.rule(cfg.val_env_manager.group_size == 1 or not is_int(cfg.val_env_manager.group_size),
         "val_env_manager.group_size", "validation runs one env per group (group_size 1)")


def _check_symmetric_views(c: Checker, cfg, name: str) -> None:
  m, key = cfg[name], f"{name}.symmetric_views"
  views = m.get("symmetric_views", ())
  if not views:
    return
  if not isinstance(views, (tuple, list)) or not all(isinstance(v, str) for v in views):
    c.error(key, f"must be a tuple of board symmetry names, got {views!r}")
    return
  c.rule(name == "train_env_manager", key, "views are training samples; validation "
         "plays the policy's own episodes only")
  c.rule(m.env_manager_type == "step", key,
         f"needs step-wise samples ({name}.env_manager_type='step'), got "
         f"{m.env_manager_type!r}")
  for view in views:
    if view not in envs.symmetry.TRANSFORMS:
      c.error(key, f"unknown board symmetry {view!r}"
              f"{did_you_mean(view, envs.symmetry.TRANSFORMS)}; known: "
              f"{', '.join(envs.symmetry.TRANSFORMS)}")
  for tag in m.tags if isinstance(m.tags, tuple) else ():
    env_type = cfg.custom_envs[tag].get("env_type") if tag in cfg.custom_envs else None
    if env_type in envs.registered_env_types():
      missing = [v for v in views if v in envs.symmetry.TRANSFORMS
                 and v not in envs.env_class(env_type).SYMMETRIES]
      c.rule(not missing, key, f"env {tag!r} ({env_type}) has no board symmetry "
             f"{missing}; it has {list(envs.env_class(env_type).SYMMETRIES) or 'none'}")
