"""Host memory allocator settings for XLA:CPU processes (glibc malloc).

XLA:CPU allocates a jitted program's temporaries afresh on every call: ~600 MB for
one gradient step of the default model on 64 x 160 tokens. glibc hands out blocks
that large with mmap and gives them back with munmap on free, so every call
page-faults its whole working set in again: ~200k page faults per step on a 2-core
CPU, and the step ran 1.42x faster without them (bench/host_malloc.py). With the
settings below freed blocks stay in the heap and the next call reuses them:
- `mmap_max=0`: no mmap for large blocks, and `trim_threshold` high: the heap top
  is never handed back;
- `arena_max=1`: every thread allocates from the main heap; glibc's per-thread
  arenas fall back to mmap for large blocks whatever `mmap_max` says, and XLA's
  worker threads do the allocating.
The cost is that the process keeps its peak heap (it would touch it again on the
next step anyway). glibc reads these settings only at process start, so an entry
point re-executes itself once with them (`reexec_with_tuned_malloc`); child
processes, Ray's workers included, inherit the environment. `ROLLX_MALLOC_TUNING=0`
keeps the system default.

A rollout server is different: its peak comes from rare calls
(a full prefill of a long conversation) while its steady decode steps are small, and
keeping that peak took `configs/sokoban.py:multiturn`'s server from 1.8 to 2.8 GiB
(bench/server_memory.py). A server process switches itself to `SERVER_MALLOPT` when
it starts (`use_server_malloc`, glibc's mallopt): blocks over 64 MiB are mapped and
unmapped, and more than 128 MiB free at the heap top is given back; on that load it
peaked at 1.8 GiB and took 172-177 s, against 185 s with the trainer's settings.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLES = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
            "glibc.malloc.trim_threshold=68719476736")
# mallopt parameter -> value (glibc's malloc.h: M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3,
# M_MMAP_MAX -4, M_ARENA_MAX -8); 65536 is glibc's default M_MMAP_MAX
SERVER_MALLOPT = {-8: 1, -4: 65536, -3: 64 * 2**20, -1: 128 * 2**20}
OPT_OUT = "ROLLX_MALLOC_TUNING"
_server_malloc = False  # use_server_malloc switched this process


def tuned_environ(environ=None) -> dict | None:
  """`environ` with rollx's malloc tunables added, or None if nothing is to change
  (opted out, not glibc, or GLIBC_TUNABLES already names a malloc setting: the
  user's choice stands)."""
  environ = dict(os.environ if environ is None else environ)
  if environ.get(OPT_OUT, "1") == "0" or not sys.platform.startswith("linux"):
    return None
  if platform.libc_ver()[0] != "glibc":
    return None
  current = environ.get("GLIBC_TUNABLES", "")
  if "glibc.malloc." in current:
    return None
  environ["GLIBC_TUNABLES"] = ":".join([current, *TUNABLES] if current else TUNABLES)
  return environ


def server_malloc_allowed(environ=None) -> bool:
  """Whether use_server_malloc may switch a process started from `environ`: not when
  opted out, not glibc, or when GLIBC_TUNABLES holds a malloc setting of the user's own
  (rollx's trainer settings, inherited, are replaced)."""
  environ = dict(os.environ if environ is None else environ)
  users = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t and t not in TUNABLES]
  return tuned_environ(dict(environ, GLIBC_TUNABLES=":".join(users))) is not None


def use_server_malloc() -> bool:
  """Switches this process to SERVER_MALLOPT (a rollout server, at its start) where
  server_malloc_allowed; returns whether it did."""
  global _server_malloc
  if not server_malloc_allowed():
    return False
  import ctypes
  libc = ctypes.CDLL("libc.so.6")
  applied = [libc.mallopt(k, v) == 1 for k, v in SERVER_MALLOPT.items()]  # every one
  _server_malloc = all(applied)
  return _server_malloc


def server_malloc_in_use() -> bool:
  """Whether use_server_malloc switched this process."""
  return _server_malloc


def reexec_with_tuned_malloc() -> None:
  """Replaces this process by the same command line with the tunables set (a no-op
  when they are set already); call it first thing in an entry point's main."""
  environ = tuned_environ()
  if environ is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)


if __name__ == "__main__":
  # `python -m rollx.hostmem`: the GLIBC_TUNABLES value a process started from this
  # environment should get ('' when nothing is to change). launch/node.sh sets it for
  # `ray start`: Ray's workers inherit the raylet's environment, not the trainer's.
  tuned = tuned_environ()
  print(tuned["GLIBC_TUNABLES"] if tuned else "")
