"""The arguments every training command shares: a YAML recipe, dotted overrides, --no-progress."""

from __future__ import annotations

import argparse


def add_recipe_arguments(p: argparse.ArgumentParser, recipe: str, example: str) -> None:
    p.add_argument("--config", "-c", help=f"YAML recipe (see {recipe})")
    p.add_argument("overrides", nargs="*", metavar="key=value", help=f"dotted overrides, e.g. {example}")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
