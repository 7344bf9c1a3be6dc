"""Tools for tool-using agents: a registry of named tools (OpenAI function schema), the
Hermes-style call parser, and the tools that ship: `calculator` (exact arithmetic) and
`python` (a sandboxed interpreter per episode).

    @register_tool("lookup", "Looks a word up.", {"type": "object", "properties":
                   {"word": {"type": "string"}}, "required": ["word"]})
    def lookup(word): ...

    tools = toolset(["calculator", "python", "lookup"])
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Sequence

from rollx.tools.base import (ERROR_KINDS, Tool, ToolCall, ToolResult, ToolSession, ToolSet,
                              parse_tool_calls)
from rollx.tools.calculator import CALCULATOR_SCHEMA, calculate
from rollx.tools.sandbox import PYTHON_SCHEMA, PythonSandbox

_TOOLS: Dict[str, Tool] = {}


def register_tool(name: str, description: str, parameters: Mapping[str, Any],
                  timeout_s: float = 10.0, session: bool = False) -> Callable:
  """Decorator: makes `fn` the tool `name` (`session=True`: it also gets `session=`)."""

  def wrap(fn):
    if name in _TOOLS and _TOOLS[name].fn is not fn:
      raise ValueError(f"tool {name!r} is already registered")
    _TOOLS[name] = Tool(name, description, dict(parameters), fn, timeout_s, session)
    return fn

  return wrap


def registered_tools() -> list:
  return sorted(_TOOLS)


def get_tool(name: str) -> Tool:
  try:
    return _TOOLS[name]
  except KeyError:
    raise KeyError(f"unknown tool {name!r}; registered: {', '.join(registered_tools())}") from None


def toolset(names: Sequence[str], **limits) -> ToolSet:
  return ToolSet([get_tool(n) for n in names], **limits)


@register_tool("calculator", "Evaluates an arithmetic expression exactly (+ - * / // % ** "
               "and parentheses).", CALCULATOR_SCHEMA, timeout_s=5.0)
def _calculator(expression):
  return calculate(expression)


@register_tool("python", "Runs Python code in a sandboxed interpreter (no network, no "
               "files outside its directory). Variables persist across calls; print "
               "results or end with an expression.", PYTHON_SCHEMA, timeout_s=30.0,
               session=True)
async def _python(code, session: ToolSession):
  sandbox = session.state.get("python")
  if sandbox is None:
    # its own output cap under the tool set's, so its marker says how much was dropped
    sandbox = session.state["python"] = PythonSandbox(
        mode=session.toolset.python_sandbox,
        output_chars=max(100, session.toolset.max_response_chars - 100))
  return await sandbox.run(code)


__all__ = ["ERROR_KINDS", "Tool", "ToolCall", "ToolResult", "ToolSession", "ToolSet",
           "parse_tool_calls", "register_tool", "registered_tools", "get_tool", "toolset",
           "calculate", "PythonSandbox"]
