"""Typed configs: pydantic models, YAML recipes, dotted command-line overrides.

A stage's config is one pydantic model. It is built from (lowest to highest precedence):
the model's defaults → a YAML recipe (``--config recipes/sft.yaml``) → dotted overrides
(``optim.lr=1e-4 data.max_seq_len=512``). Unknown keys are errors, not silently ignored, and the
error names the key. The resolved config is written to ``<run_dir>/config.yaml`` by the stage.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from posttrain.errors import UserError

C = TypeVar("C", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config: unknown fields are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ConfigError(UserError, ValueError):
    pass


def cache_dir() -> Path:
    """Where converted models and other derived artifacts live (never in git).

    ``$POSTTRAIN_CACHE`` wins; otherwise ``$XDG_CACHE_HOME/posttrain`` or ``~/.cache/posttrain``.
    """
    env = os.environ.get("POSTTRAIN_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "posttrain"


def _parse_scalar(raw: str) -> Any:
    """Override values are YAML scalars: ``1e-4`` → float, ``true`` → bool, ``[1,2]`` → list."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_override(tree: dict[str, Any], dotted: str) -> None:
    if "=" not in dotted:
        raise ConfigError(f"override {dotted!r} must look like key.sub=value")
    key, raw = dotted.split("=", 1)
    parts = key.strip().split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {key!r}: {p!r} is not a section")
        node = nxt
    node[parts[-1]] = _parse_scalar(raw)


def _format_validation_error(cls: type[BaseModel], err: ValidationError, source: str) -> str:
    """One line: every bad field by its dotted path (a plug-in's path includes its ``type``, e.g.
    ``algo.loss.pg.clip_hihg``), with what is wrong with it."""
    problems = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (misspelt?)"
        problems.append(f"{loc}: {msg}")
    return f"invalid {cls.__name__} config ({source}): " + "; ".join(problems)


def load_config(
    cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None
) -> C:
    tree: dict[str, Any] = {}
    source = "defaults"
    if path:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping")
        tree = loaded
        source = str(p)
    for o in overrides or []:
        apply_override(tree, o)
    if overrides:
        source += " + overrides " + " ".join(overrides)
    try:
        return cls.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(cls, e, source)) from None


def save_config(cfg: BaseModel, run_dir: str | Path) -> Path:
    out = Path(run_dir) / "config.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return out
