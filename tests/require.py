"""Optional dependencies that ``make setup`` installs: a test that needs one runs in CI, always.

``require(module, extra)`` imports the module; where it is missing the test is skipped with the
install command printed, except under CI (``CI`` set), where ``make setup`` installs every extra the
default test run needs, so a missing one is a failure of the set-up, not a reason to skip.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        why = f"{module} is not installed ({e}): pip install -e '.[{extra}]' (make setup installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs make setup, which installs the [{extra}] extra, but: {why}")
        pytest.skip(why)
