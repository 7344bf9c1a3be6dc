"""rollx environments: gym-like text envs behind one registry.

Importing this package registers the built-in envs (by `env_type` and with
gymnasium as `rollx/<Name>-v0`). `envs` imports nothing from `rollx`.
"""

from envs.base import TextEnv, TextEnvConfig
from envs.registry import (env_class, env_config_fields, make_env, make_env_config,
                           register_env, registered_env_types, UnknownEnvError)
from envs import frozenlake, sokoban, task, webshop  # noqa: F401  (registers the built-ins)
from envs import symmetry  # noqa: F401

__all__ = ["TextEnv", "TextEnvConfig", "env_class", "env_config_fields", "make_env",
           "make_env_config", "register_env", "registered_env_types", "UnknownEnvError"]
