"""Environments from a run's ``envs`` config: in process, or a client of a resource server.

Every way an ``envs`` entry can be wrong is a one-line ``ConfigError`` naming the entry and what to
do: an unknown name, constructor arguments the environment does not take, a server that cannot be
reached. The stages build their environments before the model loads, so these fail in seconds.
"""

from __future__ import annotations

import logging
from typing import Any

from posttrain.configs import ConfigError
from posttrain.configs.rl import EnvSpec


def build_envs(specs: list[EnvSpec]) -> dict[str, Any]:
    """Name → environment; an entry with a ``url`` talks to ``posttrain serve-env`` over HTTP."""
    import posttrain.envs  # noqa: F401  (registers the built-in environments)
    from posttrain.engines.openai_compat import RemoteCallError
    from posttrain.envs.base import ENVIRONMENTS, make_env
    from posttrain.envs.remote import RemoteEnvironment

    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"envs: each environment may appear once, got {names}")
    if not any(s.ratio > 0 for s in specs):
        raise ConfigError("envs: at least one environment needs ratio > 0 (ratio 0 is validation only)")
    envs: dict[str, Any] = {}
    for i, s in enumerate(specs):
        if s.url:
            quiet = logging.getLogger("posttrain.engines.openai_compat")
            level = quiet.level
            quiet.setLevel(logging.ERROR)  # the retries of the first contact: the error below says it all
            try:
                envs[s.name] = RemoteEnvironment(s.url)
            except RemoteCallError as e:
                why = (str(e).splitlines() or [""])[0][:300]
                raise ConfigError(f"envs[{i}].url: the environment server at {s.url} cannot be reached ({why}); start "
                                  f"it (`posttrain serve-env {s.name} --port PORT`) or fix the URL") from None
            finally:
                quiet.setLevel(level)
            continue
        if s.name not in ENVIRONMENTS:
            raise ConfigError(f"envs[{i}].name: unknown environment {s.name!r}; known: "
                              f"{', '.join(ENVIRONMENTS.names())} (`posttrain envs` lists them)")
        try:
            envs[s.name] = make_env(s.name, **s.args)
        except (TypeError, ValueError) as e:  # an argument it does not take, or a value it refuses
            raise ConfigError(f"envs[{i}].args: {s.name} refuses {s.args}: {e}") from None
    return envs
