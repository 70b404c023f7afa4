"""``posttrain serve-env``: serve a registered environment over HTTP, NeMo Gym's resource-server
contract (the server and its limits: ``serving/server.py``; docs/env_server.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from posttrain.serving.server import (MAX_BODY_BYTES, MAX_SESSION_BYTES, MAX_SESSIONS, MAX_TASK_BYTES, MAX_TASK_INDEX,
                                      MAX_TASKS_KEPT, MAX_TASKS_PER_REQUEST, serve)


def parse_env_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``["n_docs=5", "name=x"]`` → ``{"n_docs": 5, "name": "x"}``: values are JSON when they parse
    as JSON, strings otherwise."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg {pair!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


# serve-env's flags for the server's limits: (flag, create_app keyword, default, what it bounds).
LIMIT_FLAGS: tuple[tuple[str, str, int, str], ...] = (
    ("--max-body-bytes", "max_body_bytes", MAX_BODY_BYTES,
     "bytes of one request body; a larger one is a 413, refused before it is parsed"),
    ("--max-tasks-per-request", "max_tasks_per_request", MAX_TASKS_PER_REQUEST,
     "tasks in one /tasks answer; a larger n is a 422 (clients page with offset)"),
    ("--max-task-index", "max_task_index", MAX_TASK_INDEX,
     "offset + n of one /tasks request, the deepest task it may reach; beyond is a 422"),
    ("--max-sessions", "max_sessions", MAX_SESSIONS,
     "sessions kept (and closed session ids remembered); the least recently used goes first"),
    ("--max-session-bytes", "max_session_bytes", MAX_SESSION_BYTES,
     "JSON bytes of all sessions (their tasks and steps), and of the closed ids"),
    ("--max-tasks-kept", "max_tasks", MAX_TASKS_KEPT,
     "tasks remembered for task_id look-ups; the least recently used is forgotten first"),
    ("--max-task-bytes", "max_task_bytes", MAX_TASK_BYTES, "JSON bytes of the tasks remembered"),
)


def _at_least_one(text: str) -> int:
    """A flag's whole number of at least 1 (``1048576`` or ``1_048_576``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _shown(default: int) -> str:
    mib, rest = divmod(default, 1 << 20)
    return f"{default} = {mib} MiB" if mib and not rest else str(default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``posttrain serve-env``."""
    parser.add_argument("name", help="registered environment name, e.g. math or workplace")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--env-arg", action="append", default=[], metavar="KEY=VALUE",
        help="keyword argument for the environment's constructor (repeatable; JSON values)",
    )
    group = parser.add_argument_group("limits", "what one client can make the server read, send or keep "
                                                "(docs/env_server.md, Limits); whole numbers of at least 1")
    for flag, key, default, what in LIMIT_FLAGS:
        group.add_argument(flag, dest=key, type=_at_least_one, default=default, metavar="N",
                           help=f"{what} (default {_shown(default)})")


def limits_of(args: argparse.Namespace) -> dict[str, int]:
    """The ``create_app`` keywords serve-env's limit flags give."""
    return {key: getattr(args, key) for _, key, _, _ in LIMIT_FLAGS}


def run(args: argparse.Namespace) -> None:
    serve(args.name, host=args.host, port=args.port, limits=limits_of(args), **parse_env_args(args.env_arg))
