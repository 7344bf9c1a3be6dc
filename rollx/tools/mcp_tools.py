"""Tools from local MCP servers (Model Context Protocol, the `mcp` package, stdio).

    custom_envs.<tag>.mcp_servers = ("python my_server.py --flag",)

Each command starts one server process; its tools (name, description, input schema)
join the entry's tool set at start-up, and a call becomes the server's `tools/call`.
A result the server marks as an error, or a server that fails, is a `tool_error` the
model reads, as for any tool.

The `mcp` client is anyio-based: a session must be entered and left by one task. So one
task per event loop owns the session and serves calls from a queue; episodes of that
loop share the server process.
"""

from __future__ import annotations

import asyncio
import functools
import shlex
from typing import Any, Dict, List, Tuple

from rollx.tools.base import Tool

START_TIMEOUT_S = 60.0


@functools.lru_cache(maxsize=None)
def server_tools(command: str) -> Tuple[Tool, ...]:
  """The tools of the MCP server `command`, one server (and session per event loop) per
  process however many envs of the process list it."""
  return tuple(MCPServer(command).tools())


class MCPServer:
  """One stdio MCP server command."""

  def __init__(self, command: str, timeout_s: float = 30.0):
    argv = shlex.split(command)
    if not argv:
      raise ValueError("mcp_servers: an empty command")
    self.command, self.argv, self.timeout_s = command, argv, timeout_s
    self._connections: Dict[int, "_Connection"] = {}

  def _params(self):
    from mcp import StdioServerParameters
    return StdioServerParameters(command=self.argv[0], args=self.argv[1:])

  def tools(self) -> List[Tool]:
    """The server's tools, asked once at start-up (in a loop of its own)."""

    async def ask():
      from mcp import ClientSession
      from mcp.client.stdio import stdio_client
      async with stdio_client(self._params()) as (read, write):
        async with ClientSession(read, write) as session:
          await session.initialize()
          return (await session.list_tools()).tools

    try:
      listed = asyncio.run(asyncio.wait_for(ask(), START_TIMEOUT_S))
    except Exception as e:  # noqa: BLE001 - a config error: name the command
      raise ValueError(f"mcp_servers: {self.command!r} did not list its tools: "
                       f"{type(e).__name__}: {e}") from None
    out = []
    for t in listed:

      async def call(_name=t.name, **arguments):
        return await self.call(_name, arguments)

      out.append(Tool(t.name, t.description or "", dict(t.inputSchema or {"type": "object"}),
                      call, self.timeout_s))
    return out

  async def call(self, name: str, arguments: Dict[str, Any]) -> str:
    loop = asyncio.get_running_loop()
    connection = self._connections.get(id(loop))
    if connection is None or connection.task.done():
      connection = self._connections[id(loop)] = _Connection(self._params())
    result = await connection.call(name, arguments)
    text = "\n".join(getattr(c, "text", None) or f"[{getattr(c, 'type', 'content')}]"
                     for c in result.content)
    if result.isError:
      raise RuntimeError(text or f"{name} failed")
    return text


class _Connection:
  """The task that owns one MCP session in the current event loop."""

  def __init__(self, params):
    self.params = params
    self.queue: asyncio.Queue = asyncio.Queue()
    self.ready = asyncio.get_running_loop().create_future()
    self.task = asyncio.ensure_future(self._serve())

  async def _serve(self):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client
    try:
      async with stdio_client(self.params) as (read, write):
        async with ClientSession(read, write) as session:
          await session.initialize()
          self.ready.set_result(None)
          while True:
            name, arguments, future = await self.queue.get()
            try:
              future.set_result(await session.call_tool(name, arguments))
            except Exception as e:  # noqa: BLE001 - the caller reports it
              if not future.done():
                future.set_exception(e)
    except Exception as e:  # noqa: BLE001
      if not self.ready.done():
        self.ready.set_exception(e)
      while not self.queue.empty():
        _, _, future = self.queue.get_nowait()
        if not future.done():
          future.set_exception(RuntimeError(f"MCP server stopped: {e}"))

  async def call(self, name: str, arguments: Dict[str, Any]):
    await asyncio.wait_for(asyncio.shield(self.ready), START_TIMEOUT_S)
    if self.task.done():
      raise RuntimeError("the MCP server stopped")
    future = asyncio.get_running_loop().create_future()
    await self.queue.put((name, arguments, future))
    return await future
