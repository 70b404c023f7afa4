"""Thread defaults for a shared machine (models/threads.py): one thread per idle core, passive waits,
and whatever the user set wins."""

from __future__ import annotations

import os

from posttrain.models import threads


def test_idle_cores_follow_the_load_where_proc_stat_is_missing(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(threads, "busy_cores", lambda cpus, interval=0.1: None)
    for load, want in ((0.1, 2), (0.7, 1), (1.4, 1), (9.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert threads.idle_cores() == want, load


def _stat(path, rows: dict[int, list[int]]) -> None:
    total = [sum(col) for col in zip(*rows.values())]
    path.write_text("\n".join([f"cpu  {' '.join(map(str, total))} 0 0"]
                              + [f"cpu{i} {' '.join(map(str, v))} 0 0" for i, v in rows.items()]
                              + ["intr 1 2 3", "ctxt 99"]) + "\n")


def test_busy_cores_count_only_this_process_cpus_and_not_idle_or_iowait(tmp_path):
    stat = tmp_path / "stat"
    #            user nice system idle iowait irq softirq steal
    _stat(stat, {0: [100, 0, 0, 100, 0, 0, 0, 0], 1: [0, 0, 0, 200, 0, 0, 0, 0], 2: [0, 0, 0, 200, 0, 0, 0, 0]})
    assert threads.cpu_times({0, 1}, str(stat)) == (100.0, 400.0)  # cpu2 is not ours
    _stat(stat, {0: [0, 0, 0, 100, 100, 0, 0, 0]})
    assert threads.cpu_times({0}, str(stat)) == (0.0, 200.0)  # waiting on I/O leaves the core free
    assert threads.cpu_times({0}, str(tmp_path / "missing")) is None


def test_idle_cores_from_busy_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.9, 0.9, 0.9))  # the phantom load of an idle VM: ignored
    for busy, want in ((0.004, 2), (0.4, 2), (0.6, 1), (1.0, 1), (2.0, 1)):
        monkeypatch.setattr(threads, "busy_cores", lambda cpus, interval=0.1, busy=busy: busy)
        assert threads.idle_cores() == want, busy


def test_busy_cores_on_this_machine_is_a_share_of_its_cpus():
    cpus = os.sched_getaffinity(0)
    busy = threads.busy_cores(cpus, 0.05)
    assert busy is not None and 0.0 <= busy <= len(cpus)


def test_defaults_only_fill_what_the_user_left_unset(monkeypatch):
    monkeypatch.setattr(threads, "idle_cores", lambda: 1)
    env: dict[str, str] = {}
    assert threads.set_thread_defaults(env) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.set_thread_defaults(env) == {} and env["OMP_NUM_THREADS"] == "2"
