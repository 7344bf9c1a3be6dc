"""A LangGraph ReAct agent on verifiable tasks, with rollx's tools, trained as written.

    python -m rollx.train --config=configs/langgraph_arithmetic.py

The agent is LangGraph's prebuilt ReAct graph over langchain-openai's chat model; the
only rollx-specific lines are where it points: `task.base_url` (the episode's
OpenAI-compatible endpoint, whose calls rollx records token-exactly) and `task.tools`
(the config's tools, run per episode by rollx: the Python sandbox keeps its state across
the episode's calls). The reply that ends the run is scored by the task's env (its
`<answer>`).
"""

from __future__ import annotations

from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

MAX_MODEL_CALLS = 4  # tool rounds + the answer, as the tool loop's max_turns


def langchain_tools(task):
  """The episode's tools as LangChain tools (their OpenAI schemas kept as they are)."""
  def make(schema):
    function = schema["function"]

    async def run(**arguments):
      return await task.call_tool(function["name"], arguments)

    return StructuredTool.from_function(coroutine=run, name=function["name"],
                                        description=function["description"],
                                        args_schema=function["parameters"])
  return [make(s) for s in task.tools]


async def solve(task):
  model = ChatOpenAI(base_url=task.base_url, api_key=task.api_key, model=task.model,
                     max_retries=0)
  agent = create_react_agent(model, langchain_tools(task), prompt=task.system_prompt)
  try:
    # a ReAct step is a model call and a tool round: 2 graph steps per model call
    await agent.ainvoke({"messages": [("user", task.observation)]},
                        {"recursion_limit": 2 * MAX_MODEL_CALLS})
  except GraphRecursionError:
    return 0.0  # never answered
  return None  # the env scores the final reply
