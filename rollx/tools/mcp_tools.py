"""Tools from local MCP servers (Model Context Protocol, the `mcp` package, stdio).

    custom_envs.<tag>.mcp_servers = ("python my_server.py --flag",)

Each command starts one server process; its tools (name, description, input schema)
join the entry's tool set at start-up, and a call becomes the server's `tools/call`.
A result the server marks as an error, or a server that fails, is a `tool_error` the
model reads, as for any tool. The name a call reaches is the listed tool's, never one
from the model's arguments; an argument the tool's schema does not list is an error the
model reads. A call past `timeout_s` is a `timeout` and restarts the server process (its
one event loop may be stuck in that call): later calls go to a fresh one.

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
CALL_TIMEOUT_S = 30.0  # a tool call's answer, after which the server is restarted


@functools.lru_cache(maxsize=None)
def server_tools(command: str) -> Tuple[Tool, ...]:
  """The tools of the MCP server `command`, one server (and session per event loop) per
  process however many envs of the process list it."""
  return tuple(MCPServer(command).tools())


class MCPServer:
  """One stdio MCP server command."""

  def __init__(self, command: str, timeout_s: float = CALL_TIMEOUT_S):
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
    return [Tool(t.name, t.description or "", dict(t.inputSchema or {"type": "object"}),
                 self._caller(t.name, t.inputSchema or {}), self.timeout_s) for t in listed]

  def _caller(self, name: str, schema: Dict[str, Any]):
    """The tool function of `name`: the name is bound here, so no model argument (a
    `name` or `_name` key included) can choose another tool of the server."""
    known = schema.get("properties")

    async def call(**arguments):
      unknown = sorted(set(arguments) - set(known)) if known is not None else []
      if unknown:  # MCP schemas rarely forbid extra keys; a server may ignore them silently
        raise ValueError(f"{name} has no argument {unknown[0]!r}; its arguments: "
                         f"{', '.join(known) or 'none'}")
      return await self.call(name, arguments)

    return call

  async def call(self, name: str, arguments: Dict[str, Any]) -> str:
    loop = asyncio.get_running_loop()
    connection = self._connections.get(id(loop))
    if connection is None or connection.task.done():
      connection = self._connections[id(loop)] = _Connection(self._params())
    try:
      result = await connection.call(name, arguments)
    except (asyncio.CancelledError, asyncio.TimeoutError):
      # the tool set's timeout (or the episode's end) cancelled a call the server did not
      # answer: its process may be stuck in it, so the next call starts a fresh one
      if self._connections.get(id(loop)) is connection:
        del self._connections[id(loop)]
      connection.close()
      raise
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
    self.calls: set = set()  # the calls in flight, each its own task: none waits on another
    self.task = asyncio.ensure_future(self._serve())

  async def _one(self, session, name, arguments, future):
    try:
      result = await session.call_tool(name, arguments)
      if not future.done():
        future.set_result(result)
    except Exception as e:  # noqa: BLE001 - the caller reports it
      if not future.done():
        future.set_exception(e)

  def close(self) -> None:
    """Ends the session; leaving stdio_client stops the server process."""
    for call in list(self.calls):
      call.cancel()
    self.task.cancel()
    while not self.queue.empty():
      _, _, future = self.queue.get_nowait()
      if not future.done():
        future.set_exception(RuntimeError("the MCP server was restarted"))

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
            call = asyncio.ensure_future(self._one(session, name, arguments, future))
            self.calls.add(call)
            call.add_done_callback(self.calls.discard)
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
