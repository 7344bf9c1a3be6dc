"""Tools: exact arithmetic without eval, the call parser under bad input, schema checks,
and concurrency (the Python sandbox: tests/tools/test_sandbox.py)."""

import asyncio
import json

import pytest

from rollx import tools
from rollx.tools import calculator


@pytest.mark.parametrize("expression, value", [
    ("0.1 + 0.2", "0.3"), ("2 ** 100", str(2 ** 100)), ("1 / 3", "1/3 (~ 0.3333333333)"),
    ("(1234 * 5678 - 9) / 7", "1000949"), ("-7 // 2", "-4"), ("7 % -3", "-2"),
    ("2 ^ 10", "1024"), ("1 / 8", "0.125"), ("-(3 - 10) * 1.5", "10.5"),
])
def test_the_calculator_is_exact(expression, value):
  assert tools.calculate(expression) == value


@pytest.mark.parametrize("expression, why", [
    ("__import__('os').system('ls')", "unsupported syntax"), ("x + 1", "unsupported syntax"),
    ("1 / 0", "division by zero"), ("10 ** 10 ** 10", "too large"), ("2 ** 0.5", "whole-number"),
    ("(" * 300 + "1" + ")" * 300, "cannot parse"), ("1 +", "cannot parse"), ("'a' * 3", "unsupported"),
    ("9" * 2000, "longer than"), ("[1, 2]", "unsupported syntax"),
])
def test_the_calculator_refuses_by_message(expression, why):
  with pytest.raises(calculator.CalculatorError, match=why):
    tools.calculate(expression)


def run(session, text):
  return asyncio.run(session.run(session.parse(text)))


def call(name, arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_parser_and_tools_under_bad_input_never_raise_and_count_each_kind():
  session = tools.toolset(["calculator"], max_calls=50).session()
  fuzz = [
      '<tool_call>{"name": "calculator", "arguments": {"expression": "1+</tool_call>',  # truncated
      '<tool_call>{"name": "calculator", "arguments": {"expression": "\\"1\\" + 2"}}</tool_call>',
      call("calculator", {"expression": "ünïcødé ✓ + 1"}),
      call("calculator", {"expression": "1" * 10_000}),  # 10 kB argument
      call("search", {"query": "x"}),  # unknown tool
      call("calculator", {"expression": 12}),  # wrong type
      call("calculator", {"expr": "1"}),  # missing / extra
      '<tool_call>["calculator"]</tool_call>', "<tool_call>", "<tool_call></tool_call>",
      '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"6*7\\"}"}</tool_call>',
      "no call at all", "<tool_call>" + "[" * 100_000 + "</tool_call>",
  ]
  kinds = []
  for text in fuzz:
    kinds += [r.error for r in run(session, text)]
  assert kinds.count(None) == 1  # only the arguments-as-a-JSON-string call ran (6*7)
  assert {"bad_json", "unknown_tool", "bad_arguments", "tool_error"} <= set(kinds)
  fifty = "".join(call("calculator", {"expression": f"{i} * 2"}) for i in range(60))
  results = run(session, fifty)
  assert [r.content for r in results[:50]] == [str(2 * i) for i in range(50)]
  assert len(results) == 51 and results[-1].error == "too_many_calls"
  counts = session.counts
  assert counts["calls"] == len(kinds) + 51 and counts["too_many_calls"] == 1
  assert sum(counts[k] for k in tools.ERROR_KINDS) == len([k for k in kinds if k]) + 1


def test_calls_of_one_response_run_concurrently_and_slow_ones_time_out():
  started = asyncio.Event  # created inside the loop below

  async def main():
    both = started()
    order = []

    async def first():
      await asyncio.wait_for(both.wait(), 5)  # needs `second` to run meanwhile
      order.append("first")
      return "one"

    async def second():
      both.set()
      order.append("second")
      return "two"

    async def sleepy():
      await asyncio.sleep(60)

    toolset = tools.ToolSet([
        tools.Tool("first", "", {"type": "object"}, first, 10.0),
        tools.Tool("second", "", {"type": "object"}, second, 10.0),
        tools.Tool("sleepy", "", {"type": "object"}, sleepy, 0.2)])
    session = toolset.session()
    results = await session.run(session.parse(
        call("first", {}) + call("second", {}) + call("sleepy", {})))
    return results, order

  results, order = asyncio.run(main())
  assert [r.content for r in results[:2]] == ["one", "two"] and order == ["second", "first"]
  assert results[2].error == "timeout" and "timed out after 0.2 s" in results[2].content


def test_a_registered_tool_declares_openai_schema_and_truncates_long_output():
  @tools.register_tool("echo_test", "Repeats text.", {
      "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
  def echo(text):
    return text * 3

  toolset = tools.toolset(["echo_test", "calculator"], max_response_chars=10)
  assert toolset.schemas()[0] == {"type": "function", "function": {
      "name": "echo_test", "description": "Repeats text.", "parameters": {
          "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
  (result,) = run(toolset.session(), call("echo_test", {"text": "abcdef"}))
  assert result.content == "abcdefabcd\n...[truncated 8 characters]"
  with pytest.raises(KeyError, match="unknown tool 'nope'; registered: .*calculator"):
    tools.toolset(["nope"])
