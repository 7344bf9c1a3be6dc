"""The `python` tool: code runs in a separate interpreter process, one per episode.

Limits, each ending as an error message the model reads (never an exception upward):
- wall clock per call (`wall_s`, counted once the interpreter is ready: its start is not
  the code's time): the process is killed and restarted, its variables lost;
- CPU time per call (`cpu_s`, RLIMIT_CPU raised call by call up to an episode budget);
- memory (`memory_mb`, RLIMIT_AS): an allocation past it is a MemoryError;
- output (`output_chars` captured per call, the rest dropped with a marker; files up to
  `file_mb` by RLIMIT_FSIZE);
- no network: the process starts in a new network namespace (`unshare --net`: only a
  loopback that is down) where the host allows it, and an audit hook (PEP 578) refuses
  sockets in any case;
- no processes: the audit hook refuses fork, exec, spawn, subprocess, signals to other
  processes and ctypes' symbol lookups and foreign calls (a libc fork() through ctypes;
  RLIMIT_NPROC binds no root process, so it cannot be the guard);
- no writes outside its scratch directory (the hook checks every open for writing,
  rename, remove, mkdir, chmod, link); the directory is removed at close.
State (variables, imports) persists across the calls of one episode, as in a notebook.
The audit hook guards against a model's accidents, not a determined attacker: run
untrusted agents in a container too.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

# The interpreter loop. It reads length-prefixed JSON requests on fd 0 and answers on a
# private copy of fd 1; fds 1 and 2 then point at /dev/null, so user code printing to
# them (or os.write(1, ...)) cannot corrupt the protocol.
_WORKER = r'''
import io, json, os, resource, struct, sys, traceback
proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
SCRATCH = os.path.realpath(os.getcwd())
OUTPUT_CHARS, CPU_S, MEMORY_MB, FILE_MB, EPISODE_CPU_S = map(int, sys.argv[1:6])
ME = os.getpid()
MB = 1 << 20
resource.setrlimit(resource.RLIMIT_AS, (MEMORY_MB * MB, MEMORY_MB * MB))
resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, EPISODE_CPU_S))
resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_MB * MB, FILE_MB * MB))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

def _inside(path):
    try:
        if isinstance(path, int):
            return True
        p = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    return p == SCRATCH or p.startswith(SCRATCH + os.sep) or p == os.devnull

_BLOCKED = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
            "os.forkpty", "os.system", "pty.", "ctypes.dlsym", "ctypes.call_function",
            "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at", "os.startfile", "webbrowser.",
            "urllib.", "http.", "ftplib.", "smtplib.", "os.setuid", "os.chroot")
_PATHS = {"os.remove": 1, "os.rename": 2, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1,
          "os.chown": 1, "os.link": 2, "os.symlink": 2, "os.truncate": 1, "os.utime": 1,
          "shutil.rmtree": 1, "shutil.move": 2, "shutil.copyfile": 2, "os.replace": 2}

def _hook(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed (no network, no processes)")
    if event == "os.kill" and args[0] != ME:
        raise PermissionError("sandbox: signals to other processes are not allowed")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if writing and path is not None and not _inside(path):
            raise PermissionError(f"sandbox: writing outside the scratch directory: {path}")
    n = _PATHS.get(event)
    if n:
        for path in args[:n]:
            if path is not None and not _inside(path):
                raise PermissionError(f"sandbox: {event} outside the scratch directory: {path}")

sys.addaudithook(_hook)

class Capped(io.TextIOBase):
    def __init__(self):
        self.parts, self.size, self.dropped = [], 0, 0
    def writable(self):
        return True
    def write(self, s):
        s = str(s)
        room = OUTPUT_CHARS - self.size
        if room > 0:
            self.parts.append(s[:room]); self.size += min(len(s), room)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

namespace = {"__name__": "__main__", "__builtins__": __builtins__}
proto_out.write(b"R")  # ready: the limits are set, the parent's call clocks start now
while True:
    head = proto_in.read(4)
    if len(head) < 4:
        break
    (n,) = struct.unpack(">I", head)
    data = b""
    while len(data) < n:
        chunk = proto_in.read(n - len(data))
        if not chunk:
            break
        data += chunk
    code = json.loads(data)["code"]
    out = Capped()
    sys.stdout = sys.stderr = out
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = int(used.ru_utime + used.ru_stime) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (min(spent + CPU_S, hard), hard))
    except (ValueError, OSError):
        pass
    error = None
    try:
        try:
            tree = compile(code, "<python>", "exec")
        except SyntaxError:
            raise
        import ast
        parsed = ast.parse(code, "<python>", "exec")
        last = parsed.body[-1] if parsed.body else None
        if isinstance(last, ast.Expr):  # a notebook cell shows its last expression
            parsed.body.pop()
            exec(compile(parsed, "<python>", "exec"), namespace)
            value = eval(compile(ast.Expression(last.value), "<python>", "eval"), namespace)
            if value is not None:
                print(repr(value))
        else:
            exec(tree, namespace)
    except MemoryError:
        error = "MemoryError: the code went over the sandbox's memory limit"
    except BaseException as e:
        if isinstance(e, SystemExit):
            error = "SystemExit: exit() is not needed; the interpreter keeps running"
        else:
            error = "".join(traceback.format_exception_only(type(e), e)).strip()
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    reply = {"output": "".join(out.parts), "dropped": out.dropped, "error": error}
    body = json.dumps(reply).encode()
    proto_out.write(struct.pack(">I", len(body)) + body)
'''


@functools.lru_cache(maxsize=1)
def network_isolation() -> Optional[list]:
  """The command prefix that starts a process without network ([] when the host does
  not allow a new network namespace; the audit hook still refuses sockets)."""
  unshare = shutil.which("unshare")
  if unshare is None:
    return []
  try:
    ok = subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=10).returncode == 0
  except (OSError, subprocess.SubprocessError):
    ok = False
  return [unshare, "--net", "--"] if ok else []


START_S = 60.0  # an interpreter's start, before a call's wall clock


class PythonSandbox:
  """One interpreter process (started on first use) with a scratch directory. Calls are
  blocking pipe exchanges run in a thread, so the sandbox belongs to no event loop."""

  def __init__(self, wall_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 1024,
               output_chars: int = 4000, file_mb: int = 16, episode_cpu_s: int = 120):
    self.wall_s, self.cpu_s, self.memory_mb = wall_s, cpu_s, memory_mb
    self.output_chars, self.file_mb, self.episode_cpu_s = output_chars, file_mb, episode_cpu_s
    self.scratch = tempfile.mkdtemp(prefix="rollx_python_")
    self._process: Optional[subprocess.Popen] = None
    self._lock = threading.Lock()

  def _start(self) -> bool:
    """Starts the interpreter; False (and nothing left running) if it is not ready in time."""
    # The worker sets its own rlimits before it reads any code (no preexec_fn: forking a
    # multithreaded trainer process must not run Python in the child); its own session,
    # so a kill of the group reaches anything it started.
    command = network_isolation() + [
        sys.executable, "-I", "-c", _WORKER, str(self.output_chars), str(self.cpu_s),
        str(self.memory_mb), str(self.file_mb), str(self.episode_cpu_s)]
    self._process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        cwd=self.scratch, start_new_session=True, bufsize=0,
        env={"PATH": "/usr/bin:/bin", "HOME": self.scratch, "TMPDIR": self.scratch})
    # The interpreter's start is not the code's time: on a host busy with rollouts and a
    # train step it can take seconds, which `wall_s` would otherwise charge to the first
    # call after a start (a spurious timeout that also loses the restart)
    try:
      if self._read(self._process.stdout, 1, time.monotonic() + START_S) == b"R":
        return True
    except (TimeoutError, EOFError, OSError):
      pass
    self._kill()
    return False

  def _kill(self) -> Optional[int]:
    """Kills the interpreter (if alive) and returns its exit status."""
    process, self._process = self._process, None
    if process is None:
      return None
    if process.poll() is None:
      try:
        os.killpg(process.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    for pipe in (process.stdin, process.stdout):
      pipe.close()
    try:
      return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      return None

  def _read(self, pipe, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([pipe], [], [], left)[0]:
        raise TimeoutError
      chunk = os.read(pipe.fileno(), n - len(data))
      if not chunk:
        raise EOFError
      data += chunk
    return data

  def run_blocking(self, code: str) -> str:
    """The output of `code` (and its last expression's repr), or an error message."""
    if not isinstance(code, str):
      return "error: code must be a string"
    with self._lock:
      if self._process is None or self._process.poll() is not None:
        self._kill()
        if not self._start():
          return f"error: the Python interpreter did not start within {START_S:g} s"
      process = self._process
      body = json.dumps({"code": code}).encode()
      deadline = time.monotonic() + self.wall_s
      try:
        process.stdin.write(struct.pack(">I", len(body)) + body)
        size = struct.unpack(">I", self._read(process.stdout, 4, deadline))[0]
        reply = json.loads(self._read(process.stdout, size, deadline))
      except TimeoutError:
        self._kill()
        return (f"error: timeout: the code ran over {self.wall_s:g} s; the interpreter was "
                "restarted and its variables are lost")
      except (EOFError, OSError, ValueError, struct.error):
        status = self._kill()
        why = {-signal.SIGXCPU: f"CPU time over {self.cpu_s} s",
               -signal.SIGKILL: "killed (CPU or memory limit)"}.get(status, f"exit status {status}")
        return (f"error: the interpreter stopped ({why}); it was restarted and its "
                "variables are lost")
    text = reply["output"].rstrip("\n")
    if reply["dropped"]:
      text += f"\n...[output truncated: {reply['dropped']} more characters]"
    if reply["error"]:
      text = (text + "\n" if text else "") + reply["error"]
    return text

  async def run(self, code: str) -> str:
    return await asyncio.to_thread(self.run_blocking, code)

  def close(self) -> None:
    with self._lock:
      self._kill()
    shutil.rmtree(self.scratch, ignore_errors=True)


PYTHON_SCHEMA = {
    "type": "object",
    "properties": {"code": {
        "type": "string",
        "description": "Python code; variables persist across calls; the value of a last "
                       "expression is shown, as in a notebook"}},
    "required": ["code"],
    "additionalProperties": False,
}
