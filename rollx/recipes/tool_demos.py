"""Tool-use demonstrations: conversations in which a scripted expert calls the calculator.

Real runs start from an instruct model that already calls tools. The default model has
never seen a tool call, so RL from it would have no signal; these demonstrations stand in
for the instruct tuning, honestly: they are played through the real tool loop
(rollx.rollout.agent_loops.ToolAgentLoop, the real calculator, the config's chat
template) on reasoning-gym task families *other* than the ones RL trains and validates on
(`DEMO_FAMILIES`: chain sums and products, against configs/tool_arithmetic.py's
`basic_arithmetic`), so any gain on the RL families is RL's. The expert copies the
problem's expression into one calculator call, then answers with the tool's result.

    python -m rollx.recipes.tool_demos    # ~10-15 min on 2 CPU cores

rebuilds the shipped `rollx/models/default_tools/`: the default model warm started (the
warm start of rollx.recipes.warm_start, loss on the model's turns) on these
demonstrations in configs/tool_arithmetic.py's tool loop, which starts from it. Built
once and shipped so that a run, and a test, need not spend the warm start's minutes.
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


def build_default_tools(out_dir: str, config_path: str, steps: int) -> str:
  """The default model warm started for `config_path`'s tool loop, written to `out_dir`."""
  import os
  import shutil
  import tempfile
  from rollx import config as config_lib
  from rollx.recipes import warm_start
  config = config_lib.load_file(config_path)
  config.pretrain, config.warm_start_steps = None, int(steps)
  with tempfile.TemporaryDirectory() as tmp:
    config.output_dir = tmp
    built = warm_start.for_config(config)
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(built, out_dir)
  return os.path.abspath(out_dir)


def main(argv):
  del argv
  from absl import flags
  f = flags.FLAGS
  print(f"wrote {build_default_tools(f.out_dir, f.config, f.steps)}")


if __name__ == "__main__":
  from absl import app, flags
  from rollx.models import DEFAULT_TOOLS_MODEL_DIR
  flags.DEFINE_string("out_dir", DEFAULT_TOOLS_MODEL_DIR, "where to write the model")
  flags.DEFINE_string("config", "configs/tool_arithmetic.py", "the tool config it is for")
  flags.DEFINE_integer("steps", 200, "warm-start steps")
  app.run(main)
