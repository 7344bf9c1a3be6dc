"""Agent loops: one episode for a ticket, against the rollout client, -> one Trajectory.

    loop = make_agent_loop(env_id, tag, entry, tokenizer, generate, **manager_kwargs)
    trajectory = await loop.run_episode(ticket)      # or: await loop.run_rollout_loop(scheduler)

A `custom_envs` entry picks its loop by name (`agent_loop`):
- `game` (default, rollx/rollout/env_manager.py): every response is one env action
  (`<answer>...</answer>`), trajectory-wise or step-wise samples;
- `tool` (`ToolAgentLoop` below): the model calls the entry's `tools` (Hermes
  `<tool_call>` blocks) between answers; each response without a call is the env action;
- `program` (`ProgramAgentLoop` below): the user's agent function (`agent_program`:
  LangGraph, the OpenAI SDK, ...) talks to the model through an OpenAI-compatible
  endpoint (rollx/serving/openai_endpoint.py) that records its calls token-exactly.
All produce the same Trajectory (ids, response_mask, policy versions, behaviour
log-probs, reward, transcript); nothing downstream knows which ran.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import math
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from rollx.rollout import chat
from rollx.rollout.env_manager import EnvManager, PromptTooLongError
from rollx.rollout.types import Sample, Ticket, Trajectory, oldest_response_version

NAN = math.nan


class ToolAgentLoop(EnvManager):
  """Multi-turn tool calling, token-exact, trajectory-wise (one sample per episode).

  turn: generate -> parse tool calls -> none: the response is the env action (env.step:
  reward; the episode ends when the env says so) -> else run the calls concurrently,
  append their results as `tool` messages (template ids, mask 0), generate again.
  Ends at the env's end, `max_turns` model turns, or the context budget (finish
  "length"). Tool results longer than `max_tool_response_length` tokens are cut with a
  marker. An answer the env finds invalid ends the episode (its format penalty): feeding
  it back would append a user turn, which some templates (Qwen3's) do not append-only.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    if self.step_wise:
      raise ValueError(f"custom_envs.{self.tag}: agent_loop 'tool' needs trajectory-wise "
                       "samples (env_manager_type='trajectory')")
    entry = self.entry
    self.toolset = entry_toolset(entry)
    self.max_turns = int(entry.get("max_turns") or 8)
    self.max_tool_tokens = int(entry.get("max_tool_response_length") or 256)
    self.chat = chat.ChatTemplate(self.tokenizer, self.toolset.schemas())
    self.chat.check_append_only(("tool",))  # at start-up, not mid-episode
    if not entry.get("turn_template"):  # the task as the user's message, nothing around it
      self.builder.turn_template = "{observation}"
    system = self.builder.system
    self._system = [] if system is None else [{"role": "system", "content": system}]

  def conversation(self, user_text: str) -> chat.Conversation:
    """An episode's conversation as it opens: the system prompt with the tool list, then
    `user_text` as the first user message."""
    return self.chat.conversation(self._system + [{"role": "user", "content": user_text}])

  def _cut(self, content: str) -> str:
    ids = self.chat.encode(content)
    if len(ids) <= self.max_tool_tokens:
      return content
    return (self.tokenizer.decode(ids[:self.max_tool_tokens])
            + f"\n...[truncated {len(ids) - self.max_tool_tokens} tokens]")

  async def run_episode(self, ticket: Ticket) -> Trajectory:
    env = self.env
    obs, _ = env.reset(seed=ticket.seed)
    frames = [env.render("rgb_array")] if self.render else []
    traj_key = self.trajectory_key(ticket)
    talk = self.conversation(self.builder.turn_text(obs, 1, env.actions_left))
    prompt = talk.prompt_ids()
    if len(prompt) >= min(self.max_prompt_length, self.sequence_length):
      raise PromptTooLongError(
          f"the first prompt of env {self.tag!r} is {len(prompt)} tokens; it must fit "
          f"actor_infer.strategy_args.max_prefill_length ({self.max_prompt_length}) and "
          f"leave room for a response within {self.sequence_length} tokens")
    ids, mask = list(prompt), [0] * len(prompt)
    versions, behaviour = [-1] * len(prompt), [NAN] * len(prompt)
    transcript: List[Dict[str, Any]] = []
    turn_prompt = list(prompt)  # the template ids before this turn's response
    session = self.toolset.session()
    score, finish, info = 0.0, "truncated", {"success": False, "num_invalid_actions": 0}
    try:
      for turn in range(1, self.max_turns + 1):
        budget = min(self.max_tokens, self.sequence_length - len(ids))
        if budget < 1 or len(ids) > self.max_prompt_length:
          finish = "length"
          break
        _, response, text = await self._respond(ticket, turn, traj_key, budget, ids, mask,
                                                versions, behaviour)
        calls = session.parse(text)
        record = {"turn": turn, "prompt_ids": turn_prompt, "response_ids": response,
                  "response": text, "observation": obs}
        if calls:
          results = await session.run(calls)
          tool_messages = [{"role": "tool", "name": r.name, "content": self._cut(r.content)}
                           for r in results]
          record.update(action="tool_call", reward=0.0, valid=True,
                        tool_calls=[(c.name, c.arguments) for c in calls],
                        tool_results=[m["content"] for m in tool_messages],
                        tool_errors=[r.error for r in results])
          transcript.append(record)
          if self.on_turn is not None:
            self.on_turn(self, record)
          follow = talk.extend(text, response, tool_messages)
          if (len(ids) + len(follow) >= self.sequence_length
              or len(ids) + len(follow) > self.max_prompt_length):
            finish = "length"  # the results leave no room to answer: the sample ends here
            break
          turn_prompt = follow
          ids += follow
          mask += [0] * len(follow)
          versions += [-1] * len(follow)
          behaviour += [NAN] * len(follow)
          continue
        obs, reward, terminated, truncated, info = env.step(text)
        score += reward
        record.update(action=info["action"], reward=reward, valid=info["action_is_valid"],
                      kind=info.get("action_kind"))
        transcript.append(record)
        if self.on_turn is not None:
          self.on_turn(self, record)
        if self.render:
          frames.append(env.render("rgb_array"))
        finish = "terminated" if terminated else "truncated"
        break  # an answer ends the episode (see the class doc)
    finally:
      session.close()
    sample = Sample(ids, mask, versions, float(score), behaviour_logp=behaviour)
    counts = dict(session.counts)
    return Trajectory(
        ticket=ticket, samples=[sample], score=float(score), success=bool(info["success"]),
        num_turns=len(transcript), num_invalid_actions=int(info.get("num_invalid_actions", 0)),
        finish=finish, start_version=oldest_response_version([sample]),
        transcript=transcript, frames=frames, tool_counts=counts)


def entry_toolset(entry):
  """The tools a `custom_envs` entry offers: registered `tools` and its MCP servers'."""
  from rollx import tools as tools_lib
  from rollx.tools.mcp_tools import server_tools
  from rollx.tools import sandbox
  declared = [tools_lib.get_tool(n) for n in entry.get("tools") or ()]
  for command in entry.get("mcp_servers") or ():
    declared += server_tools(command)
  mode = entry.get(sandbox.CONFIG_KEY, "bwrap")
  if "python" in (entry.get("tools") or ()):
    sandbox.require(mode)  # refuses here, in the env worker, not at the model's first call
  return tools_lib.ToolSet(declared, python_sandbox=mode)


def load_program(spec: str) -> Callable:
  """The async function `spec` ("package.module:function") names; errors name what is
  missing."""
  if not isinstance(spec, str) or not re.fullmatch(r"[\w.]+:[\w.]+", spec or ""):
    raise ValueError(f"expected 'package.module:function', got {spec!r}")
  module_name, _, attr = spec.partition(":")
  fn = importlib.import_module(module_name)
  for part in attr.split("."):
    fn = getattr(fn, part)
  if not inspect.iscoroutinefunction(fn):
    raise ValueError(f"{spec} is not an async function (async def {attr}(task): ...)")
  return fn


@dataclasses.dataclass
class ProgramTask:
  """What an agent program gets for one episode.

  Its model calls go to `base_url` (OpenAI's API; `api_key` and `model` as any value
  works); they are recorded as this episode's. The task is the env, reset to `seed`:
  `observation` is its first observation (a problem's text, a board), `prompt` the same
  in the entry's turn template. Programs that act
  in the env call `await task.step(text)`; programs that answer once return None and the
  env scores their last reply. `tools` are the entry's tools in OpenAI's schema;
  `await task.call_tool(name, arguments)` runs one (a sandboxed interpreter keeps its
  state across the episode's calls) and returns its text, errors included."""
  episode_id: str
  seed: int
  observation: str
  prompt: str  # the first user message as rollx's own loops phrase it (turn template)
  base_url: str
  system_prompt: Optional[str]
  tools: List[Dict[str, Any]]
  env: Any
  model: str = "rollx"
  api_key: str = "rollx"
  rewards: List[float] = dataclasses.field(default_factory=list)
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)
  ended: str = ""  # "terminated" | "truncated" once a step ended the env's episode
  _session: Any = None

  async def step(self, text: str) -> Tuple[str, float, bool, Dict[str, Any]]:
    """One env step on the model's text: (observation, reward, done, info)."""
    obs, reward, terminated, truncated, info = self.env.step(text)
    self.rewards.append(float(reward))
    self.info = info
    self.ended = "terminated" if terminated else ("truncated" if truncated else "")
    return obs, float(reward), bool(terminated or truncated), info

  async def call_tool(self, name: str, arguments: Dict[str, Any]) -> str:
    from rollx.tools import ToolCall
    result, = await self._session.run([ToolCall(name, arguments)])
    return result.content


class ProgramAgentLoop(EnvManager):
  """One run of the entry's `agent_program` per episode, trajectory-wise.

  The env worker's OpenAI endpoint records the program's calls (`endpoint` is shared by
  a worker's program loops; without one the loop starts its own on first use). Samples:
  the recording's (one per unbroken run of calls, rollx/rollout/recording.py), each with
  the episode score. The score: the program's return value if it returns a number; else
  the rewards of its `task.step` calls; else the env's score of its last reply. A
  program that runs out of context (a call refused with `context_length_exceeded`) ends
  with finish "length" whatever it raised; any other exception is an env error (the
  scheduler runs the episode again)."""

  def __init__(self, *args, endpoint=None, **kwargs):
    super().__init__(*args, **kwargs)
    if self.step_wise:
      raise ValueError(f"custom_envs.{self.tag}: agent_loop 'program' needs trajectory-wise "
                       "samples (env_manager_type='trajectory')")
    self.program = load_program(self.entry.get("agent_program", ""))
    self.toolset = entry_toolset(self.entry)
    self.endpoint = endpoint

  def trajectory_key(self, ticket: Ticket) -> str:
    """The episode's id: also a path segment of its endpoint URL, so no slashes."""
    return f"{self.tag}-g{ticket.group_id}-n{ticket.generation}-e{self.env_id}"

  async def _endpoint(self):
    if self.endpoint is None:
      from rollx.serving.openai_endpoint import OpenAIEndpoint
      self.endpoint = OpenAIEndpoint(self.generate, self.tokenizer)
    return await self.endpoint.start()

  async def run_episode(self, ticket: Ticket) -> Trajectory:
    from rollx.serving.openai_chat import EpisodeSettings
    endpoint = await self._endpoint()
    env = self.env
    obs, _ = env.reset(seed=ticket.seed)
    frames = [env.render("rgb_array")] if self.render else []
    episode_id = self.trajectory_key(ticket)
    rec = endpoint.open_episode(episode_id, EpisodeSettings(
        mode=self.mode, sequence_length=self.sequence_length,
        max_prompt_length=self.max_prompt_length, default_max_tokens=self.max_tokens,
        max_tokens_cap=self.max_tokens, honour_sampling=False))
    session = self.toolset.session()
    task = ProgramTask(episode_id, ticket.seed, obs,
                       self.builder.turn_text(obs, 1, env.actions_left),
                       endpoint.episode_url(episode_id),
                       self.builder.system, self.toolset.schemas(), env, _session=session)
    finish = "terminated"
    try:
      result = await self.program(task)
    except asyncio.CancelledError:
      raise
    except Exception:
      if not rec.context_exceeded:
        raise
      result, finish = None, "length"
    finally:
      session.close()
      endpoint.close_episode(episode_id)
    if not rec.calls:
      if rec.context_exceeded:  # no first call fits: every episode would fail alike
        raise PromptTooLongError(
            f"the first model call of agent program {self.entry['agent_program']} (env "
            f"{self.tag!r}) does not fit min(sequence_length, actor_infer.strategy_args."
            f"max_cache_length) ({self.sequence_length}) with room to reply")
      raise RuntimeError(f"agent program {self.entry['agent_program']} made no model call")
    info = task.info
    if isinstance(result, (int, float)) and not isinstance(result, bool):
      score = float(result)
    elif task.rewards:
      score = sum(task.rewards)
      finish = task.ended or finish
    elif finish == "length":
      score = 0.0
    else:  # the env scores the final reply (a task env's <answer>)
      _, reward, _, _, info = env.step(rec.calls[-1]["reply"].get("content") or "")
      score = float(reward)
    if self.render:
      frames.append(env.render("rgb_array"))
    transcript = [{"turn": i + 1, "prompt_ids": c["prompt_ids"], "response_ids": c["response_ids"],
                   "response": c["response"], "observation": obs if i == 0 else "",
                   "action": "tool_call" if c["reply"].get("tool_calls") else "reply",
                   "reward": 0.0, "valid": True} for i, c in enumerate(rec.calls)]
    if transcript:
      transcript[-1]["reward"] = score
    for record in transcript if self.on_turn is not None else ():  # rollx.play's printout
      self.on_turn(self, record)
    samples = rec.samples(score)
    counts = dict(session.counts) if session.counts["calls"] else {}
    counts.update({f"sample_break_{k}": v for k, v in rec.breaks.items() if v})
    return Trajectory(
        ticket=ticket, samples=samples, score=score,
        success=bool(info.get("success", score >= 1.0)), num_turns=len(rec.calls),
        num_invalid_actions=int(info.get("num_invalid_actions", 0)), finish=finish,
        start_version=oldest_response_version(samples), transcript=transcript, frames=frames,
        tool_counts=counts)


def describe_turn(tokenizer, record: Dict[str, Any]) -> str:
  """A transcript turn as `rollx.play` prints it: the prompt the model saw, its response,
  each tool call and result (tool loop), the parsed action and the reward."""
  lines = [f"----- turn {record['turn']} -----", "[prompt]", tokenizer.decode(record["prompt_ids"]),
           f"[response] {record['response']!r}"]
  for (name, arguments), result in zip(record.get("tool_calls", ()), record.get("tool_results", ())):
    lines += [f"[tool call] {name or '?'} {arguments!r}", f"[tool result] {result!r}"]
  lines.append(f"[action] {record['action'] or 'INVALID'}   [reward] {record['reward']:+.2f}")
  return "\n".join(lines)


AGENT_LOOPS = {"game": EnvManager, "tool": ToolAgentLoop, "program": ProgramAgentLoop}


def make_agent_loop(env_id: int, tag: str, entry, tokenizer, generate, **kwargs) -> EnvManager:
  """The agent loop `entry["agent_loop"]` names ('game' when unset) for one env."""
  name = entry.get("agent_loop") or "game"
  if name not in AGENT_LOOPS:
    raise ValueError(f"custom_envs.{tag}.agent_loop: unknown agent loop {name!r}; "
                     f"known: {', '.join(sorted(AGENT_LOOPS))}")
  if name != "program":
    kwargs.pop("endpoint", None)
  return AGENT_LOOPS[name](env_id, tag, entry, tokenizer, generate, **kwargs)
