"""rollx.hostmem: entry points re-execute with glibc malloc settings that keep freed
large blocks (XLA:CPU's per-step temporaries) in the heap."""

import json
import os
import subprocess
import sys

import pytest

from rollx import hostmem
from tests.conftest import ROOT

# Allocates, touches and frees a 128 MiB block five times; prints the minor page
# faults of the last four rounds and the tunables the process ran with.
CHILD = """
import os, resource, sys
from rollx import hostmem
hostmem.reexec_with_tuned_malloc()
server = len(sys.argv) > 1 and hostmem.use_server_malloc()  # as a rollout server starts
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def round_():  # as XLA:CPU's temporaries: plain malloc, written, freed
  p = libc.malloc(128 * 2**20)
  ctypes.memset(p, 1, 128 * 2**20)
  libc.free(p)
round_()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
  round_()
import json
print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0,
                  os.environ.get("GLIBC_TUNABLES", ""), server]))
"""

glibc_only = pytest.mark.skipif(hostmem.tuned_environ({}) is None,
                                reason="rollx.hostmem tunes glibc on Linux only")


def run_child(*args, **env):
  out = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT, **env), timeout=120, check=True)
  faults, tunables, server = json.loads(out.stdout)
  return faults, tunables, server


def test_tuned_environ_adds_to_the_users_settings_and_respects_theirs():
  if hostmem.tuned_environ({}) is None:
    assert not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION")
    return
  assert hostmem.tuned_environ({})["GLIBC_TUNABLES"] == ":".join(hostmem.TUNABLES)
  other = hostmem.tuned_environ({"GLIBC_TUNABLES": "glibc.rtld.nns=2", "X": "1"})
  assert other["GLIBC_TUNABLES"] == "glibc.rtld.nns=2:" + ":".join(hostmem.TUNABLES)
  assert other["X"] == "1"
  # a malloc setting of the user's own, or the opt-out: nothing changes
  assert hostmem.tuned_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}) is None
  assert hostmem.tuned_environ({hostmem.OPT_OUT: "0"}) is None


def test_servers_may_switch_malloc_unless_the_user_chose():
  if hostmem.tuned_environ({}) is None:
    assert not hostmem.server_malloc_allowed({})
    return
  assert hostmem.server_malloc_allowed({})
  # the trainer's settings (what reexec_with_tuned_malloc set) are replaced, not the user's
  assert hostmem.server_malloc_allowed(hostmem.tuned_environ({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}))
  assert not hostmem.server_malloc_allowed({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
  assert not hostmem.server_malloc_allowed({hostmem.OPT_OUT: "0"})


@glibc_only
def test_reexec_keeps_freed_large_blocks_mapped():
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  os.environ.pop("GLIBC_TUNABLES", None)
  try:
    tuned_faults, tunables, _ = run_child()
    default_faults, default_tunables, _ = run_child(**{hostmem.OPT_OUT: "0"})
    # a rollout server started from the trainer's environment switches to its own
    # settings: a 128 MiB block (over 64 MiB) is mapped afresh each round, not kept
    server_faults, server_tunables, switched = run_child("server")
  finally:
    os.environ.clear()
    os.environ.update(env)
  assert tunables == ":".join(hostmem.TUNABLES) and default_tunables == ""
  # 4 rounds x 32k pages: glibc's default maps every round's block afresh
  assert default_faults > 4 * 32768 * 0.9
  assert tuned_faults < 2000
  assert switched and server_tunables == tunables and server_faults > 4 * 32768 * 0.9
