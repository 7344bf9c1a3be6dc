"""env_type -> env class, and the gymnasium ids of the same classes.

A user adds an environment with one decorator and one `custom_envs` entry:

    @register_env("MyEnv")
    class MyEnv(TextEnv):
      Config = MyEnvConfig
      ...

    config.custom_envs.MyTag = rollx.config.env_entry("MyEnv", env_config={...})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional

import gymnasium

_ENVS: Dict[str, type] = {}
GYM_NAMESPACE = "rollx"


class UnknownEnvError(KeyError):

  def __str__(self):
    return str(self.args[0])


def register_env(name: str, *, gym_id: Optional[str] = None) -> Callable[[type], type]:
  """Class decorator: makes `name` usable as `env_type` and as a gymnasium id.

  The gymnasium id defaults to `rollx/<name>-v0`.
  """

  def wrap(cls: type) -> type:
    if name in _ENVS and _ENVS[name] is not cls:
      raise ValueError(f"env_type {name!r} is already registered to {_ENVS[name]!r}")
    if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
      raise TypeError(f"env class {cls.__name__} needs a dataclass `Config` attribute")
    _ENVS[name] = cls
    env_id = gym_id or f"{GYM_NAMESPACE}/{name}-v0"
    if env_id not in gymnasium.registry:
      gymnasium.register(id=env_id, entry_point=_gym_entry_point(name))
    cls.env_type = name
    return cls

  return wrap


def _gym_entry_point(name: str):

  def make(render_mode: Optional[str] = None, **env_config):
    return make_env(name, env_config, render_mode=render_mode)

  return make


def registered_env_types() -> list:
  return sorted(_ENVS)


def env_class(env_type: str) -> type:
  try:
    return _ENVS[env_type]
  except KeyError:
    raise UnknownEnvError(
        f"unknown env_type {env_type!r}; registered: {', '.join(registered_env_types())}"
    ) from None


def env_config_fields(env_type: str) -> Dict[str, dataclasses.Field]:
  return {f.name: f for f in dataclasses.fields(env_class(env_type).Config)}


def make_env_config(env_type: str, env_config: Optional[Mapping[str, Any]] = None):
  """Builds the env's Config dataclass; unknown keys raise naming the key."""
  cls = env_class(env_type)
  env_config = dict(env_config or {})
  fields = env_config_fields(env_type)
  unknown = sorted(set(env_config) - set(fields))
  if unknown:
    raise ValueError(
        f"env_config key {unknown[0]!r} is not a field of {env_type}; "
        f"known: {', '.join(sorted(fields))}")
  return cls.Config(**env_config)


def make_env(env_type: str, env_config: Optional[Mapping[str, Any]] = None,
             render_mode: Optional[str] = None):
  cls = env_class(env_type)
  return cls(make_env_config(env_type, env_config), render_mode=render_mode)
