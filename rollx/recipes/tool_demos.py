"""Tool-use demonstrations and copy samples: the data of the tool model's start.

Real runs start from an instruct model that already calls tools. The default model has
never seen a tool call, so RL from it would have no signal; these demonstrations stand in
for the instruct tuning, honestly: they are played through the real tool loop
(rollx.rollout.agent_loops.ToolAgentLoop, the real calculator, the config's chat
template) on reasoning-gym task families *other* than the ones RL trains and validates on
(`DEMO_FAMILIES`: chain sums and products, against configs/tool_arithmetic.py's
`basic_arithmetic`), so any gain on the RL families is RL's. The expert copies the
problem's expression into one calculator call, then answers with the tool's result.

`copy_episodes` are the copy pretraining before them: a pretrained LLM copies text from
its context and the default model does not, so random strings of digits, operators and
brackets are repeated verbatim or put into a calculator call, and random numbers read
back from a tool response into an answer (the copy skill and the call's shape; no
arithmetic, no reasoning-gym family).

Pure generators: rollx.recipes.tool_start trains on them (docs/tool_arithmetic_recipe.md).
"""

from __future__ import annotations

import asyncio
import json
import re
import types
from typing import List, Sequence

import numpy as np

from rollx.rollout.agent_loops import make_agent_loop
from rollx.rollout.chat import ChatTemplate
from rollx.rollout.types import Sample, Ticket, Trajectory

# reasoning-gym family -> generator options; none of them is an RL family of the configs
DEMO_FAMILIES = {
    "chain_sum": {"min_terms": 2, "max_terms": 4, "min_digits": 2, "max_digits": 4},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3},
}
DEMO_TAG = "ToolDemo"  # the tag of the demonstrations' samples (the warm start's loss keys on it)
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
  entry = dict(entry, agent_loop="tool", agent_program="")  # an agent program's tools too
  entry["env_config"] = dict(entry["env_config"], datasets=tuple(DEMO_FAMILIES),
                             dataset_params=json.dumps(DEMO_FAMILIES), split="train")
  loop = make_agent_loop(0, DEMO_TAG, entry, tokenizer, None,
                         sequence_length=sequence_length)
  loop.generate = Expert(tokenizer, loop)
  rng = np.random.default_rng(seed)
  out = []
  for i in range(num_episodes):
    trajectory = asyncio.run(loop.run_episode(Ticket(0, DEMO_TAG, i, 0,
                                                     int(rng.integers(2**31)))))
    if trajectory.success:
      out.append(trajectory)
  return out


def demo_families_overlap(families: Sequence[str]) -> List[str]:
  """The families of `families` that the demonstrations also use (must be none)."""
  return sorted(set(families) & set(DEMO_FAMILIES))


COPY_TAG = "CopyPretraining"  # the tag of the copy-pretraining samples
# Frames of the copy requests; none is a reasoning-gym family's wording.
_COPY_FRAMES = ("Work out", "What is", "Find", "Compute", "Evaluate:", "Please compute",
                "Tell me", "Value of")
_COPY_CHARS = list("0123456789")


def _random_expression(rng) -> str:
  """1-5 numbers of 1-5 digits (a quarter negative), joined by + - * / with or without
  spaces, sometimes bracketed: the characters a calculator call carries, no task."""
  terms = ["-" * (rng.random() < 0.25) + "".join(rng.choice(_COPY_CHARS, rng.integers(1, 6)))
           for _ in range(rng.integers(1, 6))]
  out = terms[0]
  for term in terms[1:]:
    op = rng.choice(list("+-*/"))
    out += f" {op} {term}" if rng.random() < 0.7 else f"{op}{term}"
  if len(terms) > 1 and rng.random() < 0.3:
    out = f"( {out} )" if rng.random() < 0.5 else f"-({out})"
  return out


def _random_number(rng) -> str:
  out = "-" * (rng.random() < 0.3) + "".join(rng.choice(_COPY_CHARS, rng.integers(1, 9)))
  if rng.random() < 0.15:
    out += "." + "".join(rng.choice(_COPY_CHARS, rng.integers(1, 4)))
  return out


def copy_episodes(tokenizer, num_episodes: int, seed: int, repeat_share: float = 0.6,
                  entry=None, sequence_length: int = 1024) -> List[Trajectory]:
  """Copy-pretraining samples in the chat format (`COPY_TAG`, the model's turns marked
  in response_mask): `repeat_share` of them "Repeat: X" answered by X (20-60 random
  characters of digits, operators, brackets, spaces: the dense copy signal), the rest a
  random expression put into a calculator call, then a random number read back from
  the tool response into <answer>. Without `entry` a sample is its user message alone
  (short rows); with a tool `entry` (a custom_envs entry) it opens as that entry's tool
  loop opens an episode, system prompt and tool list first: a copy learned only in short
  contexts does not survive a prompt of several hundred tokens."""
  if entry:
    loop = make_agent_loop(0, COPY_TAG, dict(entry, agent_loop="tool", agent_program=""),
                           tokenizer, None, sequence_length=sequence_length)
    opening = loop.conversation
  else:
    template = ChatTemplate(tokenizer)  # the loop's own rendering, no tool list
    opening = lambda ask: template.conversation([{"role": "user", "content": ask}])
  rng = np.random.default_rng(seed)
  eos = [tokenizer.eos_token_id]
  out = []
  for i in range(num_episodes):
    if rng.random() < repeat_share:
      text = "".join(rng.choice(list("0123456789+-*/ ()"), rng.integers(20, 61)))
      ask, responses, results = f"Repeat: {text}", [text], []
    else:
      expression, result = _random_expression(rng), _random_number(rng)
      call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
      ask = f"{rng.choice(_COPY_FRAMES)} {expression}{rng.choice(['.', ' =', '?', ''])}"
      responses = [f"<tool_call>\n{call}\n</tool_call>", f"<answer>{result}</answer>"]
      results = [[{"role": "tool", "name": "calculator", "content": result}]]
    talk = opening(ask)
    ids = talk.prompt_ids()
    mask = [0] * len(ids)
    for k, response in enumerate(responses):
      response_ids = tokenizer.encode(response, add_special_tokens=False) + eos
      ids += response_ids
      mask += [1] * len(response_ids)
      if k < len(results):  # the template's ids up to the next response
        follow = talk.extend(response, response_ids, results[k])
        ids += follow
        mask += [0] * len(follow)
    sample = Sample(ids, mask, [-1] * len(ids), 0.0)
    out.append(Trajectory(Ticket(0, COPY_TAG, i, 0, 0), [sample], 0.0, True, len(responses),
                          0, "terminated", -1))
  return out
