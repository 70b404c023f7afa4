"""The project's one reader of ``/proc/cpuinfo``: what the CPU is, for the precision probe's cache key
(``models/precision.py``), MKL's vendor check (``models/blas.py``) and every bench row."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_fields(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's ``key: value`` lines of ``cpuinfo`` (``model name``, ``flags``,
    ``vendor_id``, ...); {} where that file cannot be read."""
    fields: dict[str, str] = {}
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if not line.strip() and fields:  # a blank line ends the first processor's block
                break
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """(CPU model name, its flags) from the first processor in ``cpuinfo``; the platform's name and no
    flags where that file cannot be read."""
    fields = cpu_fields(cpuinfo)
    return (fields.get("model name") or platform.processor() or platform.machine(),
            frozenset(fields.get("flags", "").split()))
