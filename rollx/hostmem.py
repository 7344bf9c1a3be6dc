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
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLES = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
            "glibc.malloc.trim_threshold=68719476736")
OPT_OUT = "ROLLX_MALLOC_TUNING"


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
