"""The `python` tool's sandbox, tried as an attacker would: every attempt is judged by its
effect on the host (a file absent, a canary absent from what the code could print, a
victim process alive, a listener that saw no connection), never by the tool's words."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from rollx import tools
from rollx.errors import ConfigError
from rollx.tools import sandbox as sandbox_lib

CANARY = "rollx-canary-7f3a9c"


@pytest.fixture(scope="module")
def box():
  """One bwrap sandbox for the whole module: attempts run one after another in the same
  interpreter, as an episode's calls do (state carries over; a crash restarts it)."""
  os.environ["ROLLX_TEST_SECRET"] = CANARY  # in this (the trainer's) environment
  sandbox = sandbox_lib.PythonSandbox(wall_s=30.0, cpu_s=10, memory_mb=1024)
  yield sandbox
  sandbox.close()
  os.environ.pop("ROLLX_TEST_SECRET", None)


@pytest.fixture
def victim():
  """A process of the host, in its own group, with the canary in its environment."""
  process = subprocess.Popen(["sleep", "60"], start_new_session=True,
                             env={**os.environ, "ROLLX_VICTIM_SECRET": CANARY})
  yield process
  process.kill()
  process.wait()


def run(box, code: str) -> str:
  return box.run_blocking(code)


def test_files_of_the_host_cannot_be_read(box, tmp_path):
  secret = tmp_path / "goal.txt"
  secret.write_text(CANARY)
  with open("/etc/passwd") as f:
    passwd = f.readline().strip()
  out = run(box, f"print(open({str(secret)!r}).read())\nprint(open('/etc/passwd').read())")
  assert CANARY not in out and passwd not in out
  out = run(box, f"import os\nfd = os.open('/', os.O_RDONLY)\n"
                 f"print(os.read(os.open({str(secret)[1:]!r}, os.O_RDONLY, dir_fd=fd), 99))")
  assert CANARY not in out


def test_environments_of_the_host_cannot_be_read(box, victim):
  code = (f"import os\nfor pid in (os.getppid(), {os.getpid()}, {victim.pid}, 1, 2):\n"
          f"  try:\n    print(open(f'/proc/{{pid}}/environ').read())\n"
          f"  except OSError as e:\n    print(e)\n"
          f"print(dict(os.environ))")
  assert CANARY not in run(box, code)


@pytest.mark.parametrize("how", ["open", "sqlite3", "dir_fd", "prefix", "ctypes"])
def test_nothing_is_written_outside_the_scratch_directory(box, tmp_path, how):
  target = tmp_path / f"written_by_{how}"
  prefix_target = os.path.join(sys.base_prefix, f"rollx_written_by_{how}")
  code = {
      "open": f"open({str(target)!r}, 'w').write('x')",
      "sqlite3": f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t(x)')",
      "dir_fd": (f"import os\nfd = os.open('/', os.O_RDONLY)\n"
                 f"os.open({str(target)[1:]!r}, os.O_CREAT | os.O_WRONLY, dir_fd=fd)"),
      "prefix": f"open({prefix_target!r}, 'w').write('x')",
      "ctypes": (f"import ctypes\nlibc = ctypes.CDLL(None)\n"
                 f"libc.open({str(target).encode()!r}, 0o101, 0o644)"),
  }[how]
  run(box, code)
  assert not target.exists() and not os.path.exists(prefix_target)


@pytest.mark.parametrize("how", ["posixsubprocess", "subprocess", "posix_spawn", "fork_exec",
                                 "os_system", "ctypes_system", "ctypes_fork"])
def test_no_program_is_started(box, tmp_path, how):
  # every attempt writes the marker file through a shell, a file the sandbox cannot see
  # anyway; the pid list of the host tells whether a process was started at all
  marker = tmp_path / f"ran_{how}"
  shell = ["/bin/sh", "-c", f"touch {marker}"]
  code = {
      "posixsubprocess": (
          "import _posixsubprocess, os\nr, w = os.pipe()\n"
          f"_posixsubprocess.fork_exec({shell!r}, [b'/bin/sh'], True, (w,), None, None, "
          "-1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)"),
      "subprocess": f"import subprocess\nsubprocess.run({shell!r})",
      "posix_spawn": f"import os\nos.waitpid(os.posix_spawn('/bin/sh', {shell!r}, {{}}), 0)",
      "fork_exec": (f"import os\npid = os.fork()\nif pid == 0:\n  os.execv('/bin/sh', {shell!r})\n"
                    "os.waitpid(pid, 0)"),
      "os_system": f"import os\nos.system({' '.join(shell[:2]) + ' ' + repr(shell[2])!r})",
      "ctypes_system": f"import ctypes\nctypes.CDLL(None).system({f'touch {marker}'.encode()!r})",
      "ctypes_fork": ("import ctypes, os\nlibc = ctypes.CDLL(None)\npid = libc.fork()\n"
                      f"if pid == 0:\n  os.execv('/bin/sh', {shell!r})\n"
                      "pid2 = libc.syscall(57)\nprint(pid, pid2)"),
  }[how]
  out = run(box, code)
  assert not marker.exists()
  assert len(psutil.Process().children(recursive=True)) == 3, out  # bwrap, its init, python


def test_a_fork_loop_leaves_nothing_behind():
  box = sandbox_lib.PythonSandbox(wall_s=10.0, cpu_s=5)
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  try:
    out = box.run_blocking("import os\nn = 0\nfor _ in range(200):\n  try:\n    os.fork()\n"
                           "    n += 1\n  except OSError:\n    pass\nn")
    during = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert len(during) == 3, (out, [p.name() for p in during])
  finally:
    box.close()
  time.sleep(0.2)
  assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in before]


def test_other_processes_cannot_be_signalled(box, victim):
  run(box, f"import os, signal\nfor f in (os.kill, os.killpg):\n  try:\n"
           f"    f({victim.pid}, signal.SIGKILL)\n  except OSError:\n    pass\n"
           "try:\n  os.kill(-1, signal.SIGKILL)\nexcept OSError:\n  pass")
  time.sleep(0.2)
  assert victim.poll() is None  # alive


def test_rewriting_the_interpreters_own_globals_opens_nothing(box, tmp_path):
  target = tmp_path / "after_rewrite"
  out = run(box, "import sys\nm = sys.modules['__main__']\n"
                 "for k in list(vars(m)):\n  if k.isupper() or k.startswith('_'):\n"
                 "    setattr(m, k, () if k.startswith('_') else '')\n"
                 "sys.audit_hooks = []\n"
                 f"open({str(target)!r}, 'w').write('x')")
  assert not target.exists(), out
  out = run(box, "import subprocess\nsubprocess.run(['id'], capture_output=True).stdout")
  assert "uid=" not in out


def test_a_listener_on_the_hosts_loopback_sees_nothing(box):
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(4)
  listener.settimeout(3.0)
  port = listener.getsockname()[1]
  accepted = []

  def accept():
    try:
      while True:
        accepted.append(listener.accept())
    except OSError:
      pass

  thread = threading.Thread(target=accept)
  thread.start()
  try:
    run(box, f"import socket\ntry:\n  socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
             f"except OSError:\n  pass\nimport urllib.request\ntry:\n"
             f"  urllib.request.urlopen('http://127.0.0.1:{port}/episodes/x', timeout=1)\n"
             f"except OSError:\n  pass\n"
             f"try:\n  socket.create_connection(('{socket.gethostname()}', {port}), timeout=1)\n"
             f"except OSError:\n  pass")
  finally:
    thread.join()
    listener.close()
  assert not accepted


def test_memory_is_capped_and_the_session_goes_on(box):
  assert "MemoryError" in run(box, "block = bytearray(6 * 1024 ** 3)")
  assert run(box, "1 + 1") == "2"


def test_the_scratch_directory_is_the_only_room_and_is_capped(box):
  assert run(box, "open('notes.txt', 'w').write('kept')\nopen('notes.txt').read()") == "'kept'"
  assert "Read-only file system" in run(box, "open('/notes.txt', 'w')")
  out = run(box, "import os\ntry:\n  for i in range(100):\n"
                 "    open(f'f{i}', 'wb').write(b'x' * (8 << 20))\nexcept OSError as e:\n"
                 "  print(type(e).__name__, e.errno, i)")
  assert out.startswith("OSError 28"), out  # ENOSPC: 32 MB in all, well before 100 x 8 MB
  assert int(out.split()[-1]) < 5


def test_state_output_caps_and_cpu_limit_hold():
  session = tools.toolset(["python"]).session()
  # the wall clock far past the CPU limit: on a loaded host (a test run beside training)
  # a busy loop gets a fraction of a core, and the CPU limit must still be what ends it
  box = session.state["python"] = sandbox_lib.PythonSandbox(wall_s=30.0, cpu_s=2,
                                                            output_chars=3000)
  cases = [("x = 41", ""), ("import numpy as np\nint(np.arange(4).sum())", "6"),
           ("x + 1", "42"), ("print('y' * 100_000_000)", "[output truncated: 99997001 more characters]"),
           ("while True: pass", "CPU time over 2 s"), ("'x' in globals()", "False")]

  def call(code):
    return (f'<tool_call>\n{json.dumps({"name": "python", "arguments": {"code": code}})}'
            '\n</tool_call>')

  async def episode():
    return [(await session.run(session.parse(call(code))))[0] for code, _ in cases]

  for (code, expected), result in zip(cases, asyncio.run(episode())):
    assert expected in result.content, (code, result.content[-300:])
    assert len(result.content) < 4200
  assert box.mode == "bwrap"
  session.close()


def test_a_runaway_call_is_killed_at_the_wall_clock_and_the_interpreter_restarts():
  box = sandbox_lib.PythonSandbox(wall_s=2.0, cpu_s=30)
  try:
    slow = box.run_blocking("import time\nkept = 1\ntime.sleep(30)")
    assert "timeout: the code ran over 2 s" in slow and "variables are lost" in slow
    assert box.run_blocking("'kept' in globals()") == "False"
  finally:
    box.close()


def test_an_interpreters_start_is_not_charged_to_the_calls_wall_clock(monkeypatch):
  """An interpreter that takes 1.5 s to start (a loaded host) still runs a 0.5 s-limited
  call: the wall clock starts once the interpreter is ready."""
  command = sandbox_lib.PythonSandbox.command
  monkeypatch.setattr(sandbox_lib.PythonSandbox, "command",
                      lambda self: ["sh", "-c", 'sleep 1.5; exec "$@"', "sh"] + command(self))
  box = sandbox_lib.PythonSandbox(wall_s=0.5, cpu_s=5)
  try:
    assert box.run_blocking("1 + 1") == "2"
    assert "ran over 0.5 s" in box.run_blocking("import time\ntime.sleep(5)")
    assert box.run_blocking("2 + 2") == "4"  # the restart, again not charged
  finally:
    box.close()
  monkeypatch.setattr(sandbox_lib, "START_S", 0.2)
  box = sandbox_lib.PythonSandbox(wall_s=0.5, cpu_s=5)
  try:
    assert "did not start within 0.2 s" in box.run_blocking("1 + 1")
  finally:
    box.close()


def test_a_host_that_refuses_namespaces_stops_the_run_naming_the_key(monkeypatch, tmp_path):
  """Never silently weaker: no fallback, one line with bwrap's reason and the key that
  accepts the weaker mode; 'process' is then an explicit choice."""
  refusing = tmp_path / "bwrap"
  refusing.write_text("#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\n"
                      "exit 1\n")
  refusing.chmod(0o755)
  monkeypatch.setattr(sandbox_lib, "bwrap_binary", lambda: str(refusing))
  sandbox_lib.require.cache_clear()
  entries = {"Calc": {"tools": ("python",)}, "Game": {"tools": ()}}
  try:
    with pytest.raises(ConfigError) as e:
      sandbox_lib.check_entries(entries)
    assert e.value.key == "custom_envs.Calc.python_sandbox"
    assert "No permissions to create a new namespace" in str(e.value)
    assert "python_sandbox='process'" in str(e.value)
    (line,) = sandbox_lib.check_entries({"Calc": {"tools": ("python",),
                                                  "python_sandbox": "process"}})
    assert line.startswith("python tool sandbox (Calc): process (no isolation")
  finally:
    monkeypatch.undo()
    sandbox_lib.require.cache_clear()
  (line,) = sandbox_lib.check_entries(entries)
  assert line.startswith("python tool sandbox (Calc): bwrap (own user, mount, pid, network")
