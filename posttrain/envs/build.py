"""Environments from a run's ``envs`` config: in process, or a client of a resource server."""

from __future__ import annotations

from typing import Any

from posttrain.configs import ConfigError
from posttrain.configs.rl import EnvSpec


def build_envs(specs: list[EnvSpec]) -> dict[str, Any]:
    """Name → environment; an entry with a ``url`` talks to ``posttrain serve-env`` over HTTP."""
    from posttrain.envs.base import make_env
    from posttrain.envs.remote import RemoteEnvironment

    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"envs: each environment may appear once, got {names}")
    if not any(s.ratio > 0 for s in specs):
        raise ConfigError("envs: at least one environment needs ratio > 0 (ratio 0 is validation only)")
    return {s.name: RemoteEnvironment(s.url) if s.url else make_env(s.name, **s.args) for s in specs}
