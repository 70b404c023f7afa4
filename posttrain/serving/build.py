"""Environments from a run's ``envs`` config: in process, or a client of a resource server.

Every way an ``envs`` entry can be wrong is a one-line ``ConfigError`` naming the entry and what to
do: an unknown name, constructor arguments the environment does not take, a server that cannot be
reached (a ``posttrain serve-env`` one or, with ``protocol: gym``, a NeMo Gym resource server), a
Gym dataset that is missing or not Gym rows. The stages build their environments before the model loads, so these fail in seconds.

It sits in ``serving/`` beside the clients it builds (``remote.py``, ``gym_client.py``): ``envs/``
holds the environments and imports no serving code.
"""

from __future__ import annotations

import logging
from typing import Any

from posttrain.configs import ConfigError
from posttrain.configs.rl import EnvSpec


def build_envs(specs: list[EnvSpec]) -> dict[str, Any]:
    """Name → environment; an entry with a ``url`` talks to ``posttrain serve-env`` over HTTP, or
    with ``protocol: gym`` to a NeMo Gym resource server (``GymEnvironment``)."""
    import posttrain.envs  # noqa: F401  (registers the built-in environments)

    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"envs: each environment may appear once, got {names}")
    if not any(s.ratio > 0 for s in specs):
        raise ConfigError("envs: at least one environment needs ratio > 0 (ratio 0 is validation only)")
    return {s.name: _build(i, s) for i, s in enumerate(specs)}


def _build(i: int, spec: EnvSpec) -> Any:
    """The environment of ``envs[i]``, or a one-line ``ConfigError`` naming the entry's field."""
    from posttrain.engines.openai_compat import RemoteCallError
    from posttrain.envs.base import ENVIRONMENTS, make_env
    from posttrain.serving.remote import RemoteEnvironment

    if spec.protocol == "gym":  # a NeMo Gym resource server; its tasks are the dataset's rows
        from posttrain.serving.gym_client import GymEnvironment

        try:
            env = GymEnvironment(spec.url, spec.dataset, name=spec.name, domain=spec.domain or "gym",
                                 validation_dataset=spec.val_dataset, **spec.args)
        except TypeError as e:  # an argument GymEnvironment does not take
            raise ConfigError(f"envs[{i}].args: {spec.name} (protocol gym) refuses {spec.args}: {e}") from None
        except (OSError, ValueError) as e:  # a dataset that is missing or not NeMo Gym rows
            field = "val_dataset" if spec.val_dataset and str(spec.val_dataset) in str(e) else "dataset"
            raise ConfigError(f"envs[{i}].{field}: {(str(e).splitlines() or [''])[0][:300]}") from None
        try:
            env.ping()
        except RemoteCallError as e:
            env.close()
            raise ConfigError(f"envs[{i}].url: the NeMo Gym resource server at {spec.url} cannot be reached "
                              f"({_first_line(e)}); start it or fix the URL") from None
        return env
    if spec.url:
        quiet = logging.getLogger("posttrain.engines.openai_compat")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # the retries of the first contact: the error below says it all
        try:
            return RemoteEnvironment(spec.url)
        except RemoteCallError as e:
            raise ConfigError(f"envs[{i}].url: the environment server at {spec.url} cannot be reached "
                              f"({_first_line(e)}); start it (`posttrain serve-env {spec.name} --port PORT`) "
                              "or fix the URL") from None
        finally:
            quiet.setLevel(level)
    if spec.name not in ENVIRONMENTS:
        raise ConfigError(f"envs[{i}].name: unknown environment {spec.name!r}; known: "
                          f"{', '.join(ENVIRONMENTS.names())} (`posttrain envs` lists them)")
    try:
        return make_env(spec.name, **spec.args)
    except (TypeError, ValueError) as e:  # an argument it does not take, or a value it refuses
        raise ConfigError(f"envs[{i}].args: {spec.name} refuses {spec.args}: {e}") from None


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0][:300]
