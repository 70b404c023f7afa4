"""How every bench records a result: one JSON line appended to ``bench/results/<name>.jsonl``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def append_row(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line, in one write (a concurrent bench cannot interleave with it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)
