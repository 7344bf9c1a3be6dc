"""A LangGraph ReAct agent (examples/langgraph_agent.py) trained on the tool-arithmetic
tasks: the same problems, tools and GRPO settings as configs/tool_arithmetic.py, but the
episode is the user's own agent program talking to the model through rollx's
OpenAI-compatible endpoint instead of rollx's tool loop.

Command:   python -m rollx.train --config=configs/langgraph_arithmetic.py
Hardware:  one CPU host; 2 cores are enough, no accelerator needed.
Runtime:   not measured for a learning run; a 1-step run trains (see the README).
Expected:  not measured yet: no record of this config in docs/results.md. The tool loop on
           the same tasks, from the same start: docs/results.md#tool-arithmetic-seed1

Starts, like configs/tool_arithmetic.py, from the default model warm started on
calculator demonstrations of other task families (rollx/models/default_tools). What
differs from the tool loop, by design: LangGraph renders the conversation as OpenAI
messages, so the recorded sample is the endpoint's token-exact extension of them (one
sample per episode unless the agent rewrites its history), and the model answers
LangGraph's prompt, which has no system message unless the agent gives one.
"""

import os

from rollx import config as rollx_config


def get_config():
  config = rollx_config.load_file(
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "tool_arithmetic.py"))
  config.exp_name = "langgraph_arithmetic_grpo"
  for tag in ("Arithmetic", "ArithmeticVal"):
    entry = config.custom_envs[tag]
    entry.agent_loop = "program"  # the user's agent function, one run per episode
    entry.agent_program = "examples.langgraph_agent:solve"
  return config
