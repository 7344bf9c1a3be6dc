"""Config checks of a role's mesh: the axis sizes of `strategy_args` (one may be -1,
fill), its pipeline microbatches and `device_mapping`. Called by rollx.checks for
every role; whether the sizes fit the devices is rollx.parallel.mesh's to say once the
devices are known.

Kept apart from rollx.parallel.mesh so that checking a config imports no JAX.
"""

from __future__ import annotations

from rollx.config_check import Checker, is_int


def check_strategy(c: Checker, role: str, s) -> None:
  """`s`: the role's strategy_args."""
  fills = []
  for key in ("dp_size", "fsdp_size", "tp_size", "pp_size"):
    if is_int(s[key]):
      c.rule(s[key] >= 1 or s[key] == -1, f"{role}.strategy_args.{key}",
             f"must be >= 1 or -1 (fill), got {s[key]}")
      if s[key] == -1:
        fills.append(key)
  c.rule(len(fills) <= 1, f"{role}.strategy_args.{fills[-1] if fills else ''}",
         f"only one of {', '.join(fills)} may be -1 (fill)")
  if is_int(s.num_microbatches):
    c.rule(s.num_microbatches >= 1, f"{role}.strategy_args.num_microbatches",
           f"must be >= 1, got {s.num_microbatches}")


def check_device_mapping(c: Checker, role: str, dm) -> None:
  if isinstance(dm, tuple):
    c.rule(all(is_int(d) and d >= 0 for d in dm) and len(set(dm)) == len(dm) and dm,
           f"{role}.device_mapping", f"must be distinct device ids >= 0, got {dm}")
