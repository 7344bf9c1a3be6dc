"""Config checks of the Ray cluster keys rollx.cluster reads: `ray_address` and the
`ray_resources` labels that place the env workers and servers. Called once by
rollx.checks.

Kept apart from rollx.cluster because that imports Ray, and a config is checked before
the entry point quiets Ray's logging (rollx.cli.quiet_console).
"""

from __future__ import annotations

import re

from rollx.config_check import Checker

# Ray's own resource names; a placement label must be a custom one.
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "TPU", "memory", "object_store_memory")


def check_cluster(c: Checker, cfg) -> None:
  addr = cfg.ray_address
  if addr is not None:
    c.rule(addr == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d+", addr) is not None,
           "ray_address", f"{addr!r}: expected 'auto' or host:port of a running Ray head")
  for role, name in cfg.ray_resources.items():
    if name:
      c.rule(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", name) is not None
             and name not in RAY_BUILTIN_RESOURCES, f"ray_resources.{role}",
             f"{name!r}: expected a custom resource name (letters, digits, _ or -), "
             f"not one of {', '.join(RAY_BUILTIN_RESOURCES)}")
