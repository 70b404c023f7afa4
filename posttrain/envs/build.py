"""Environments from a run's ``envs`` config: in process, or a client of a resource server."""

from __future__ import annotations

from typing import Any

from posttrain.configs import ConfigError
from posttrain.configs.rl import EnvSpec


def build_envs(specs: list[EnvSpec]) -> dict[str, Any]:
    """Name → environment; an entry with a ``url`` talks to ``posttrain serve-env`` over HTTP, or
    with ``protocol: gym`` to a NeMo Gym resource server (``GymEnvironment``)."""
    from posttrain.envs.base import make_env
    from posttrain.envs.remote import RemoteEnvironment

    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"envs: each environment may appear once, got {names}")
    if not any(s.ratio > 0 for s in specs):
        raise ConfigError("envs: at least one environment needs ratio > 0 (ratio 0 is validation only)")
    return {s.name: _build(s, make_env, RemoteEnvironment) for s in specs}


def _build(spec: EnvSpec, make_env: Any, remote: Any) -> Any:
    if spec.protocol == "gym":  # a NeMo Gym resource server; its tasks are the dataset's rows
        from posttrain.envs.gym_client import GymEnvironment

        return GymEnvironment(spec.url, spec.dataset, name=spec.name, domain=spec.domain or "gym",
                              validation_dataset=spec.val_dataset, **spec.args)
    return remote(spec.url) if spec.url else make_env(spec.name, **spec.args)
