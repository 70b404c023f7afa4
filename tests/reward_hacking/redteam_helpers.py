"""Shared body of the per-environment red-team test modules (the cases live in the library,
``posttrain/eval/redteam.py``, so ``posttrain redteam ENV`` runs the very same ones)."""

from __future__ import annotations

from typing import Any

import pytest

from posttrain.eval import redteam
from posttrain.envs.base import make_env


def make_suite(env_name: str, n_tasks: int | None = None, **env_kwargs: Any):
    """(fixture, test function) running every red-team case of ``env_name`` as its own test."""
    n = n_tasks or redteam.TEST_TASKS.get(env_name, 6)

    @pytest.fixture(scope="module")
    def env_and_tasks():
        env = make_env(env_name, **env_kwargs)
        return env, redteam.sample_tasks(env, env_name, n)

    @pytest.mark.parametrize("case", redteam.cases_for(env_name), ids=lambda c: c.name)
    def test_red_team_case(env_and_tasks, case):
        env, tasks = env_and_tasks
        result = redteam.run_case(env, case, tasks)
        assert result.applied > 0, f"case {case.name!r} applies to none of the {len(tasks)} tasks"
        assert result.ok, redteam.failure_report(result)

    return env_and_tasks, test_red_team_case
