"""Typed configs: pydantic models, YAML recipes, dotted command-line overrides.

A stage's config is one pydantic model. It is built from (lowest to highest precedence):
the model's defaults → a YAML recipe (``--config recipes/sft.yaml``) → dotted overrides
(``optim.lr=1e-4 data.max_seq_len=512``). Unknown keys are errors, not silently ignored, and the
error names the key. The resolved config is written to ``<run_dir>/config.yaml`` by the stage.

YAML is read with ``ConfigLoader``: a key given twice in one mapping is an error naming the key and
its line (plain YAML keeps the last value silently), and only ``true``/``false`` are booleans, so
``data.pack=on`` stays the string ``on`` (YAML 1.1 turns on/off/yes/no into booleans, and a choice
field then refused ``True`` with "should be 'auto', 'on' or 'off'").
"""

from __future__ import annotations

import os
import re
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


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"line {line}: duplicate key {key!r} (first given on line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


_BOOL = "tag:yaml.org,2002:bool"


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with duplicate mapping keys as errors and YAML 1.2 booleans."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # checked on the node as written, before merge keys (``<<: *base``) are flattened in: a key
        # overriding a merged one is YAML's intended use, not a duplicate
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first:
                    raise DuplicateKeyError(key, line, first[key])
            except TypeError:  # an unhashable key: the base class reports it
                continue
            first[key] = line
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML's default) also reads yes/no/on/off as booleans; keep only true/false
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load_yaml(text: str) -> Any:
    """Parse config YAML with ``ConfigLoader`` (raises ``yaml.YAMLError``, incl. ``DuplicateKeyError``)."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _parse_scalar(raw: str) -> Any:
    """Override values are YAML scalars: ``1e-4`` → float, ``true`` → bool, ``[1,2]`` → list."""
    try:
        return load_yaml(raw)
    except DuplicateKeyError as e:  # ``envs=[{name: a, name: b}]``: not a value to pass on as text
        raise ConfigError(f"override value {raw!r}: duplicate key {e.key!r}") from None
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
        elif e["type"] in ("literal_error", "enum"):  # say what was given: a YAML 1.1 habit (yes/no) shows
            msg += f" (got {e['input']!r})"
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
            loaded = load_yaml(p.read_text()) or {}
        except DuplicateKeyError as e:
            raise ConfigError(f"{p}:{e.line}: duplicate key {e.key!r} (first given on line {e.first_line}); "
                              "give each key once") from None
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
