"""MCP tools against the real fixture server (a stdio process): the called tool is the
listed one whatever the arguments say, and a stuck call neither hangs the episode nor
the server's later calls."""

import asyncio
import json
import os
import sys
import time

import psutil

from rollx import tools
from rollx.tools.mcp_tools import MCPServer

SERVER = f"{sys.executable} {os.path.join(os.path.dirname(__file__), os.pardir, 'fixtures', 'mcp_server.py')}"


def call(name, arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def servers():
  return [p for p in psutil.Process().children(recursive=True)
          if "mcp_server.py" in " ".join(p.cmdline())]


def test_a_model_argument_cannot_redirect_the_call_to_another_tool():
  session = tools.ToolSet(MCPServer(SERVER).tools()).session()

  async def episode():
    return await session.run(session.parse(
        call("add", {"a": 1, "b": 2, "_name": "shout", "text": "hi"}) +
        call("add", {"a": 1, "b": 2, "name": "shout"}) + call("add", {"a": 1, "b": 2})))

  redirected, named, plain = asyncio.run(episode())
  for result in (redirected, named):
    assert "HI" not in result.content and result.error == "tool_error", result
  assert "'_name'" in redirected.content and "'name'" in named.content
  assert plain.content == "3"


def test_a_stuck_call_times_out_and_the_next_call_gets_a_fresh_server():
  session = tools.ToolSet(MCPServer(SERVER, timeout_s=2.0).tools()).session()

  async def episode():
    start = time.monotonic()
    stuck = (await session.run(session.parse(call("hang", {"seconds": 60}))))[0]
    waited = time.monotonic() - start
    after = (await session.run(session.parse(call("add", {"a": 2, "b": 3}))))[0]
    return stuck, waited, after, time.monotonic() - start - waited

  stuck, waited, after, took = asyncio.run(episode())
  assert stuck.error == "timeout" and "hang timed out after 2 s" in stuck.content
  assert waited < 10
  assert after.content == "5" and took < 30  # not behind the 60 s sleep
  deadline = time.monotonic() + 10  # the stuck server process is stopped, not left
  while len(servers()) > 0 and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not servers()
