"""Thread defaults for a shared machine (models/threads.py): one thread per idle core, passive waits,
and whatever the user set wins."""

from __future__ import annotations

import os

from posttrain.models import threads


def test_idle_cores_follow_the_load(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for load, want in ((0.1, 2), (0.7, 1), (1.4, 1), (9.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert threads.idle_cores() == want, load


def test_defaults_only_fill_what_the_user_left_unset(monkeypatch):
    monkeypatch.setattr(threads, "idle_cores", lambda: 1)
    env: dict[str, str] = {}
    assert threads.set_thread_defaults(env) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.set_thread_defaults(env) == {} and env["OMP_NUM_THREADS"] == "2"
