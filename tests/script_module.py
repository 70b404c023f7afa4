"""A file of bench/ (a folder of scripts, not a package) imported as a module for a test."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def script_module(folder: str, name: str) -> Iterator[ModuleType]:
    """``ROOT/folder/name.py`` as a module; its folder is on ``sys.path`` while in use, so the
    script's own imports of its neighbours (``results_row``) resolve as when it runs."""
    path = str(ROOT / folder)
    sys.path.insert(0, path)
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(path)
