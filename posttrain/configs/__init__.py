"""Typed configs for every stage, importable without torch.

``base`` has the machinery (strict pydantic models, YAML recipes, dotted overrides, one-line
errors); ``plugins`` the tagged unions of pluggable parts (losses, advantage estimators, engines),
keyed on ``type`` so a misspelt field fails when the config loads; one module per stage on top.
Nothing here imports torch or a trainer (enforced by import-linter, see ``.importlinter``).
"""

from posttrain.configs.base import (ConfigError, StrictModel, apply_override, cache_dir, load_config,
                                    save_config)

__all__ = ["ConfigError", "StrictModel", "apply_override", "cache_dir", "load_config", "save_config"]
