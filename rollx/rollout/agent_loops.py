"""Agent loops: one episode for a ticket, against the rollout client, -> one Trajectory.

    loop = make_agent_loop(env_id, tag, entry, tokenizer, generate, **manager_kwargs)
    trajectory = await loop.run_episode(ticket)      # or: await loop.run_rollout_loop(scheduler)

A `custom_envs` entry picks its loop by name (`agent_loop`):
- `game` (default, rollx/rollout/env_manager.py): every response is one env action
  (`<answer>...</answer>`), trajectory-wise or step-wise samples;
- `tool` (`ToolAgentLoop` below): the model calls the entry's `tools` (Hermes
  `<tool_call>` blocks) between answers; each response without a call is the env action.
Both produce the same Trajectory (ids, response_mask, policy versions, behaviour
log-probs, reward, transcript); nothing downstream knows which ran.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from rollx.rollout import chat
from rollx.rollout.env_manager import EnvManager, PromptTooLongError
from rollx.rollout.types import Sample, Ticket, Trajectory

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
    from rollx import tools as tools_lib
    from rollx.tools.mcp_tools import server_tools
    entry = self.entry
    declared = [tools_lib.get_tool(n) for n in entry.get("tools") or ()]
    for command in entry.get("mcp_servers") or ():
      declared += server_tools(command)
    self.toolset = tools_lib.ToolSet(declared)
    self.max_turns = int(entry.get("max_turns") or 8)
    self.max_tool_tokens = int(entry.get("max_tool_response_length") or 256)
    self.chat = chat.ChatTemplate(self.tokenizer, self.toolset.schemas())
    self.chat.check_append_only(("tool",))  # at start-up, not mid-episode
    if not entry.get("turn_template"):  # the task as the user's message, nothing around it
      self.builder.turn_template = "{observation}"
    system = self.builder.system
    self._system = [] if system is None else [{"role": "system", "content": system}]

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
    traj_key = f"{self.tag}/g{ticket.group_id}/n{ticket.generation}/e{self.env_id}"
    messages: List[Dict[str, Any]] = self._system + [
        {"role": "user", "content": self.builder.turn_text(obs, 1, env.actions_left)}]
    talk = self.chat.conversation(messages)
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
        record.update(action=info["action"], reward=reward, valid=info["action_is_valid"])
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
    response_versions = [v for v, m in zip(versions, mask) if m and v >= 0]
    counts = dict(session.counts)
    return Trajectory(
        ticket=ticket, samples=[sample], score=float(score), success=bool(info["success"]),
        num_turns=len(transcript), num_invalid_actions=int(info.get("num_invalid_actions", 0)),
        finish=finish, start_version=min(response_versions, default=-1),
        transcript=transcript, frames=frames, tool_counts=counts)


def describe_turn(tokenizer, record: Dict[str, Any]) -> str:
  """A transcript turn as `rollx.play` prints it: the prompt the model saw, its response,
  each tool call and result (tool loop), the parsed action and the reward."""
  lines = [f"----- turn {record['turn']} -----", "[prompt]", tokenizer.decode(record["prompt_ids"]),
           f"[response] {record['response']!r}"]
  for (name, arguments), result in zip(record.get("tool_calls", ()), record.get("tool_results", ())):
    lines += [f"[tool call] {name or '?'} {arguments!r}", f"[tool result] {result!r}"]
  lines.append(f"[action] {record['action'] or 'INVALID'}   [reward] {record['reward']:+.2f}")
  return "\n".join(lines)


AGENT_LOOPS = {"game": EnvManager, "tool": ToolAgentLoop}


def make_agent_loop(env_id: int, tag: str, entry, tokenizer, generate, **kwargs) -> EnvManager:
  """The agent loop `entry["agent_loop"]` names ('game' when unset) for one env."""
  name = entry.get("agent_loop") or "game"
  if name not in AGENT_LOOPS:
    raise ValueError(f"custom_envs.{tag}.agent_loop: unknown agent loop {name!r}; "
                     f"known: {', '.join(sorted(AGENT_LOOPS))}")
  return AGENT_LOOPS[name](env_id, tag, entry, tokenizer, generate, **kwargs)
