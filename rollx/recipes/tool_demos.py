"""Tool-use demonstrations: conversations in which a scripted expert calls the calculator.

Real runs start from an instruct model that already calls tools. The default model has
never seen a tool call, so RL from it would have no signal; these demonstrations stand in
for the instruct tuning, honestly: they are played through the real tool loop
(rollx.rollout.agent_loops.ToolAgentLoop, the real calculator, the config's chat
template) on reasoning-gym task families *other* than the ones RL trains and validates on
(`DEMO_FAMILIES`: chain sums and products, against configs/tool_arithmetic.py's
`basic_arithmetic`), so any gain on the RL families is RL's. The expert copies the
problem's expression into one calculator call, then answers with the tool's result.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import List, Sequence

import numpy as np

from rollx.rollout.types import Ticket, Trajectory

# reasoning-gym family -> generator options; none of them is an RL family of the configs
DEMO_FAMILIES = {
    "chain_sum": {"min_terms": 2, "max_terms": 4, "min_digits": 2, "max_digits": 4},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3},
}
_EXPRESSION = re.compile(r"[-+*/()\d\s.]*\d[-+*/()\d\s.]*")
_RESULT = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)


def expression_of(question: str) -> str:
  """The longest arithmetic expression in a question (the expert reads the problem)."""
  found = [m.group(0).strip() for m in _EXPRESSION.finditer(question)]
  return max(found, key=len).rstrip(".= ") if found else ""


class Expert:
  """The scripted policy: turn 1 calls the calculator on the problem's expression; turn 2
  answers with what the tool returned (read from the served ids, as a model would)."""

  def __init__(self, tokenizer, loop):
    self.tokenizer, self.loop = tokenizer, loop

  async def __call__(self, request_id, prompt_ids, max_tokens, **_):
    import types
    text = self.tokenizer.decode(prompt_ids)
    results = _RESULT.findall(text)
    if not results:
      call = {"name": "calculator",
              "arguments": {"expression": expression_of(self.loop.env.question)}}
      out = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    else:
      out = f"<answer>{results[-1]}</answer>"
    ids = self.tokenizer.encode(out, add_special_tokens=False) + [self.tokenizer.eos_token_id]
    ids = ids[:max_tokens]
    return types.SimpleNamespace(token_ids=ids, token_versions=[-1] * len(ids),
                                 policy_version=-1, behaviour_logp=[])


def demonstration_episodes(tokenizer, entry, num_episodes: int, seed: int,
                           sequence_length: int) -> List[Trajectory]:
  """`num_episodes` solved conversations of the tool loop of `entry` (its tools, template
  and token budgets) on DEMO_FAMILIES problems; unsolved ones (never, with exact
  arithmetic) are dropped."""
  from rollx.rollout.agent_loops import make_agent_loop
  entry = dict(entry, agent_loop="tool", agent_program="")  # an agent program's tools too
  entry["env_config"] = dict(entry["env_config"], datasets=tuple(DEMO_FAMILIES),
                             dataset_params=json.dumps(DEMO_FAMILIES), split="train")
  loop = make_agent_loop(0, "ToolDemo", entry, tokenizer, None,
                         sequence_length=sequence_length)
  loop.generate = Expert(tokenizer, loop)
  rng = np.random.default_rng(seed)
  out = []
  for i in range(num_episodes):
    trajectory = asyncio.run(loop.run_episode(Ticket(0, "ToolDemo", i, 0,
                                                     int(rng.integers(2**31)))))
    if trajectory.success:
      out.append(trajectory)
  return out


def demo_families_overlap(families: Sequence[str]) -> List[str]:
  """The families of `families` that the demonstrations also use (must be none)."""
  return sorted(set(families) & set(DEMO_FAMILIES))
