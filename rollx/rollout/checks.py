"""Config checks of the `custom_envs` entries (rollx.config.env_entry): the env type and
its `env_config` (checked by building one env), the turn limits, the agent loop with its
tools, MCP servers, sandbox and agent program, and the prompt text. Called once by
rollx.checks.
"""

from __future__ import annotations

import ml_collections

import envs
from rollx import config as config_lib
from rollx import tools as tools_lib
from rollx.config_check import Checker, check_type, did_you_mean, is_int
from rollx.rollout import prompts
from rollx.rollout.agent_loops import AGENT_LOOPS, load_program
from rollx.tools import sandbox


def check_custom_envs(c: Checker, cfg) -> None:
  for tag, entry in cfg.custom_envs.items():
    path = f"custom_envs.{tag}"
    if not isinstance(entry, (ml_collections.ConfigDict, dict)):
      c.error(path, f"expected env_entry(...), got {type(entry).__name__} {entry!r}")
      continue
    for key in entry.keys():
      if key not in config_lib.ENV_ENTRY_KEYS:
        c.error(f"{path}.{key}", f"unknown key{did_you_mean(key, config_lib.ENV_ENTRY_KEYS)}")
    env_type = entry.get("env_type")
    if env_type is None:
      c.error(f"{path}.env_type", "missing")
      continue
    if env_type not in envs.registered_env_types():
      c.error(f"{path}.env_type", f"unknown env_type {env_type!r}"
              f"{did_you_mean(env_type, envs.registered_env_types())}; registered: "
              f"{', '.join(envs.registered_env_types())}")
      continue
    for key in ("max_tokens_per_step", "max_turns", "max_tool_response_length"):
      value = entry.get(key, 1)
      if not is_int(value) or value < 1:
        c.error(f"{path}.{key}", f"must be an int >= 1, got {value!r}")
    _agent_loop(c, path, entry)
    _prompts(c, path, entry)
    _env_config(c, path, entry, env_type)


def _agent_loop(c: Checker, path: str, entry) -> None:
  loop = entry.get("agent_loop", "game")
  if loop not in AGENT_LOOPS:
    c.error(f"{path}.agent_loop", f"unknown agent loop {loop!r}; known: "
            f"{', '.join(sorted(AGENT_LOOPS))}")
  names = entry.get("tools", ())
  if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
    c.error(f"{path}.tools", f"expected a tuple of tool names, got {names!r}")
  else:
    unknown = [n for n in names if n not in tools_lib.registered_tools()]
    if unknown:
      c.error(f"{path}.tools", f"unknown tool {unknown[0]!r}; registered: "
              f"{', '.join(tools_lib.registered_tools())}")
    elif names and loop not in config_lib.TOOL_LOOPS:
      c.error(f"{path}.tools", f"set, but agent_loop={loop!r} never calls tools (use 'tool')")
  mode = entry.get(sandbox.CONFIG_KEY, "bwrap")
  if mode not in sandbox.MODES:
    c.error(f"{path}.{sandbox.CONFIG_KEY}", f"unknown sandbox {mode!r}; known: "
            f"{', '.join(sandbox.MODES)}")
  servers = entry.get("mcp_servers", ())
  if not isinstance(servers, (tuple, list)) or not all(
      isinstance(x, str) and x.strip() for x in servers):
    c.error(f"{path}.mcp_servers", f"expected a tuple of commands, got {servers!r}")
  elif servers and loop not in config_lib.TOOL_LOOPS:
    c.error(f"{path}.mcp_servers", f"set, but agent_loop={loop!r} never calls tools (use 'tool')")
  program = entry.get("agent_program", "")
  if loop == "program":
    try:
      load_program(program)
    except (ValueError, ImportError, AttributeError) as e:
      c.error(f"{path}.agent_program", str(e))
  elif program:
    c.error(f"{path}.agent_program", f"set, but agent_loop={loop!r} (use 'program')")


def _prompts(c: Checker, path: str, entry) -> None:
  for key in ("system_prompt", "turn_template", "instructions"):
    if not isinstance(entry.get(key, ""), str):
      c.error(f"{path}.{key}", f"expected str, got {entry.get(key)!r}")
  if entry.get("system_prompt") == prompts.NO_SYSTEM_PROMPT and entry.get("instructions"):
    c.error(f"{path}.instructions", f"set, but system_prompt={prompts.NO_SYSTEM_PROMPT!r} "
            "leaves out the system message that carries it")
  template = entry.get("turn_template", "")
  if isinstance(template, str) and template:
    try:
      template.format(turn_idx=1, observation="", actions_left=1, max_response_length=1)
    except (KeyError, IndexError, ValueError) as e:
      c.error(f"{path}.turn_template", f"cannot be filled ({type(e).__name__}: {e}); "
              "placeholders: {turn_idx} {observation} {actions_left} {max_response_length}")


def _env_config(c: Checker, path: str, entry, env_type: str) -> None:
  env_config = entry.get("env_config") or {}
  if not isinstance(env_config, (ml_collections.ConfigDict, dict)):
    c.error(f"{path}.env_config", f"expected a block of keys, got {env_config!r}")
    return
  env_config = dict(env_config.items())
  fields = envs.env_config_fields(env_type)
  defaults = envs.env_class(env_type).Config()
  bad = False
  for key, value in env_config.items():
    if key not in fields:
      c.error(f"{path}.env_config.{key}",
              f"unknown key for env_type {env_type}{did_you_mean(key, fields)}; "
              f"known: {', '.join(fields)}")
      bad = True
      continue
    default_value = getattr(defaults, key)
    if default_value is not None and value is not None:
      ok, normalised = check_type(value, type(default_value))
      if not ok:
        c.error(f"{path}.env_config.{key}", f"expected {type(default_value).__name__}, "
                f"got {type(value).__name__} {value!r}")
        bad = True
      else:
        env_config[key] = normalised
    if isinstance(value, ml_collections.ConfigDict):
      env_config[key] = value.to_dict()
  if not bad:
    try:  # the env's own checks (sizes, symbols, ...) by building one
      envs.make_env(env_type, env_config)
    except (ValueError, TypeError) as e:
      c.error(f"{path}.env_config", str(e))
