"""Tools an agent calls: declared in OpenAI's function-calling schema, parsed from the
model's text in the Hermes / Qwen2.5 convention, run concurrently, answered as text.

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 34"}}
    </tool_call>

A response may hold several calls (run concurrently). Everything that can go wrong with
a model's call becomes the text of its tool response, counted by kind in
`ToolResult.error`, never an exception: JSON that does not parse (`bad_json`), an
unknown tool (`unknown_tool`), arguments that fail the tool's JSON schema
(`bad_arguments`), more calls than `max_calls` (`too_many_calls`), a tool over its
timeout (`timeout`), a tool that raised (`tool_error`). Output longer than
`max_response_chars` is cut with a marker (the agent loop cuts to tokens too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Union

ERROR_KINDS = ("bad_json", "unknown_tool", "bad_arguments", "too_many_calls", "timeout",
               "tool_error")
TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
MAX_PARSED_CHARS = 65536  # a response is bounded upstream; the parser bounds its own work


@dataclasses.dataclass(frozen=True)
class Tool:
  """One function the model may call. `fn(**arguments)` returns text (sync or async);
  `session=True` tools also get `session=` (per-episode state, e.g. an interpreter)."""
  name: str
  description: str
  parameters: Mapping[str, Any]  # JSON schema of the arguments object
  fn: Callable[..., Union[str, Awaitable[str]]]
  timeout_s: float = 10.0
  session: bool = False

  def schema(self) -> Dict[str, Any]:
    """OpenAI's function-calling declaration (what chat templates render as `tools`)."""
    return {"type": "function", "function": {"name": self.name, "description": self.description,
                                             "parameters": dict(self.parameters)}}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str  # "" when unknown (unparseable)
  arguments: Any  # the parsed arguments (a dict when well formed)
  error: Optional[str] = None  # an ERROR_KINDS entry when the call cannot run
  message: str = ""  # why, for the model


@dataclasses.dataclass(frozen=True)
class ToolResult:
  name: str
  content: str  # what the model reads in its tool response
  error: Optional[str] = None  # an ERROR_KINDS entry, None on success


def parse_tool_calls(text, max_calls: int = 16) -> List[ToolCall]:
  """The calls in a response, in order; never raises. A `<tool_call>` left open at the
  end (a response cut at its token budget) is a `bad_json` call."""
  if not isinstance(text, str):
    return []
  calls = []
  for match in TOOL_CALL_BLOCK.finditer(text[:MAX_PARSED_CHARS]):
    if len(calls) == max_calls:
      calls.append(ToolCall("", None, "too_many_calls",
                            f"more than {max_calls} tool calls in one response; the rest "
                            "were not run"))
      break
    body = match.group(1).strip()
    try:
      data = json.loads(body)
    except (ValueError, RecursionError) as e:
      calls.append(ToolCall("", None, "bad_json", f"the tool call is not valid JSON ({e})"))
      continue
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
      calls.append(ToolCall("", data, "bad_json",
                            'a tool call must be {"name": ..., "arguments": {...}}'))
      continue
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
      try:
        arguments = json.loads(arguments)
      except (ValueError, RecursionError):
        pass
    calls.append(ToolCall(data["name"], arguments))
  return calls


def truncate(text: str, max_chars: int) -> str:
  if len(text) <= max_chars:
    return text
  return text[:max_chars] + f"\n...[truncated {len(text) - max_chars} characters]"


class ToolSet:
  """The tools of one env entry; `session()` gives an episode its own state."""

  def __init__(self, tools: Sequence[Tool], max_calls: int = 16,
               max_response_chars: int = 4000, python_sandbox: str = "bwrap"):
    names = [t.name for t in tools]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
      raise ValueError(f"tool {duplicate!r} is declared twice")
    self.tools = {t.name: t for t in tools}
    self.max_calls, self.max_response_chars = max_calls, max_response_chars
    self.python_sandbox = python_sandbox  # the `python` tool's mode (rollx.tools.sandbox)

  def schemas(self) -> List[Dict[str, Any]]:
    return [t.schema() for t in self.tools.values()]

  def session(self) -> "ToolSession":
    return ToolSession(self)


class ToolSession:
  """One episode's tool calls: per-episode state (a Python interpreter, started on first
  use) and the counts of calls and errors by kind. `close()` ends the state."""

  def __init__(self, toolset: ToolSet):
    self.toolset = toolset
    self.state: Dict[str, Any] = {}
    self.counts: Dict[str, int] = {"calls": 0, **{k: 0 for k in ERROR_KINDS}}

  def parse(self, text) -> List[ToolCall]:
    """The calls in a response, at most the tool set's `max_calls` (then one error)."""
    return parse_tool_calls(text, self.toolset.max_calls)

  async def _run_one(self, call: ToolCall) -> ToolResult:
    tools = self.toolset.tools
    if call.error is None and call.name not in tools:
      call = dataclasses.replace(
          call, error="unknown_tool",
          message=f"unknown tool {call.name[:100]!r}; tools: {', '.join(sorted(tools))}")
    if call.error is None:
      problem = _schema_problem(tools[call.name].parameters, call.arguments)
      if problem:
        call = dataclasses.replace(call, error="bad_arguments",
                                   message=f"arguments of {call.name}: {problem}")
    if call.error is not None:
      return ToolResult(call.name, f"error: {call.message}", call.error)
    tool = tools[call.name]
    kwargs = dict(call.arguments)
    if tool.session:
      kwargs["session"] = self
    try:
      if inspect.iscoroutinefunction(tool.fn):
        out = await asyncio.wait_for(tool.fn(**kwargs), tool.timeout_s)
      else:  # in a thread: a slow one must not stall the episode's other calls
        out = await asyncio.wait_for(asyncio.to_thread(tool.fn, **kwargs), tool.timeout_s)
        if inspect.isawaitable(out):  # a plain function that returned a coroutine
          out = await asyncio.wait_for(out, tool.timeout_s)
    except asyncio.TimeoutError:
      return ToolResult(tool.name, f"error: {tool.name} timed out after {tool.timeout_s:g} s",
                        "timeout")
    except Exception as e:  # a tool's failure is the model's information, not a crash
      return ToolResult(tool.name, f"error: {type(e).__name__}: {e}", "tool_error")
    return ToolResult(tool.name, truncate(str(out), self.toolset.max_response_chars))

  async def run(self, calls: Sequence[ToolCall]) -> List[ToolResult]:
    """Every call's result, in order; the calls run concurrently."""
    results = await asyncio.gather(*(self._run_one(c) for c in calls))
    for r in results:
      self.counts["calls"] += 1
      if r.error:
        self.counts[r.error] += 1
    return list(results)

  def close(self) -> None:
    for value in self.state.values():
      close = getattr(value, "close", None)
      if close is not None:
        close()
    self.state.clear()


def _schema_problem(schema: Mapping[str, Any], arguments: Any) -> Optional[str]:
  """None when `arguments` satisfies the JSON schema, else the first problem, naming the
  argument (jsonschema: the reference validator)."""
  import jsonschema
  if not isinstance(arguments, dict):
    return f"arguments must be a JSON object, got {type(arguments).__name__}"
  validator = jsonschema.Draft202012Validator(schema)
  error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
  if error is None:
    return None
  where = ".".join(str(p) for p in error.absolute_path)
  message = error.message if len(error.message) < 300 else error.message[:300] + "..."
  return f"{where}: {message}" if where else message
