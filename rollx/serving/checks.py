"""Config checks of the rollout servers' keys: a role's sampling (`generating_args`,
`val_generating_args`) and the server settings of `strategy_args` (slots, prefill and
cache lengths, restarts). Called by rollx.checks for every role.

Kept apart from the engine so that checking a config imports no JetStream.
"""

from __future__ import annotations

from rollx.config_check import Checker, is_int
from rollx.serving import PREFILL_BUCKETS


def check_sampling(c: Checker, role: str, w) -> None:
  g = w.generating_args
  if isinstance(g.temperature, float):
    c.rule(g.temperature >= 0, f"{role}.generating_args.temperature",
           f"must be >= 0, got {g.temperature}")
  if isinstance(g.top_p, float):
    c.rule(0 < g.top_p <= 1, f"{role}.generating_args.top_p", f"must be in (0, 1], got {g.top_p}")
  for key in ("top_k",):
    if is_int(g[key]):
      c.rule(g[key] >= 0, f"{role}.generating_args.{key}", f"must be >= 0, got {g[key]}")
  for name in ("generating_args", "val_generating_args"):
    g = w.get(name)
    if g is None:
      continue
    if is_int(g.max_new_tokens):
      c.rule(g.max_new_tokens >= 1, f"{role}.{name}.max_new_tokens",
             f"must be >= 1, got {g.max_new_tokens}")
    if is_int(g.num_return_sequences):
      c.rule(g.num_return_sequences == 1, f"{role}.{name}.num_return_sequences",
             f"must be 1 (one response per request; a group's responses come from "
             f"train_env_manager.group_size envs on one level), got {g.num_return_sequences}")


def check_server(c: Checker, role: str, s) -> None:
  """`s`: the role's strategy_args."""
  for key in ("max_concurrent_decodes", "num_servers"):
    if is_int(s[key]):
      c.rule(s[key] >= 1, f"{role}.strategy_args.{key}", f"must be >= 1, got {s[key]}")
  for key in ("detokenize_depth", "prefix_cache_tokens"):
    if is_int(s[key]):
      c.rule(s[key] >= 0, f"{role}.strategy_args.{key}", f"must be >= 0, got {s[key]}")
  if is_int(s.max_restarts):
    c.rule(s.max_restarts >= -1, f"{role}.strategy_args.max_restarts",
           f"must be >= 0 or -1 (no limit), got {s.max_restarts}")
  if isinstance(s.restart_timeout_s, float):
    c.rule(s.restart_timeout_s >= 0, f"{role}.strategy_args.restart_timeout_s",
           f"must be >= 0, got {s.restart_timeout_s}")
  if is_int(s.max_prefill_length):
    c.rule(s.max_prefill_length in PREFILL_BUCKETS, f"{role}.strategy_args.max_prefill_length",
           f"must be a power of two in [16, 32768] (JetStream's buckets), got "
           f"{s.max_prefill_length}")
    if is_int(s.max_cache_length):
      c.rule(s.max_cache_length >= s.max_prefill_length,
             f"{role}.strategy_args.max_cache_length",
             f"{s.max_cache_length} is shorter than max_prefill_length={s.max_prefill_length}")
