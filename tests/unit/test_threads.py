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


def test_an_idle_machine_spins_and_is_governed_a_busy_one_waits_passively(monkeypatch):
    monkeypatch.setattr(threads, "GOVERNOR", None)
    monkeypatch.setattr(threads, "allowed_cpus", lambda: {0, 1})
    monkeypatch.setattr(threads, "idle_cores", lambda: 2)
    env: dict[str, str] = {}
    assert threads.set_thread_defaults(env) == {"OMP_NUM_THREADS": "2"}  # libgomp's own wait policy
    assert threads.GOVERNOR is not None and threads.GOVERNOR.max_threads == 2
    monkeypatch.setattr(threads, "GOVERNOR", None)
    monkeypatch.setattr(threads, "idle_cores", lambda: 1)
    assert threads.set_thread_defaults({}) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert threads.GOVERNOR is None
    # the user's thread count: passive waits, nobody adjusts it
    assert threads.set_thread_defaults({"OMP_NUM_THREADS": "2"}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert threads.GOVERNOR is None


def test_governor_gives_torch_the_cores_other_processes_leave(tmp_path):
    stat = tmp_path / "stat"
    g = threads.Governor(2, cpus={0, 1}, stat=str(stat))
    # jiffies per CPU: user nice system idle iowait irq softirq steal; 100 per CPU per second
    _stat(stat, {0: [0, 0, 0, 100, 0, 0, 0, 0], 1: [0, 0, 0, 100, 0, 0, 0, 0]})
    assert g.target(now=0.0, own_cpu_s=0.0) is None  # the first reading opens a window
    # 1 s: both cores busy, this process used 1 CPU-second -> another process holds one core
    _stat(stat, {0: [100, 0, 0, 100, 0, 0, 0, 0], 1: [100, 0, 0, 100, 0, 0, 0, 0]})
    assert g.target(now=1.0, own_cpu_s=1.0) == 1
    # next second: both cores busy, all of it this process (its own spinning counts as its own)
    _stat(stat, {0: [200, 0, 0, 100, 0, 0, 0, 0], 1: [200, 0, 0, 100, 0, 0, 0, 0]})
    assert g.target(now=2.0, own_cpu_s=3.0) == 2
    # a third of a core used by others rounds back to both cores; never more than max_threads
    _stat(stat, {0: [300, 0, 0, 100, 0, 0, 0, 0], 1: [233, 0, 0, 167, 0, 0, 0, 0]})
    assert g.target(now=3.0, own_cpu_s=4.0) == 2
    assert threads.Governor(2, cpus={0}, stat=str(tmp_path / "missing")).target(0.0, 0.0) is None


def test_governor_sets_torch_threads_and_stops_when_someone_else_does(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        g = threads.Governor(2, cpus={0, 1}, every_s=0.0)
        monkeypatch.setattr(g, "target", lambda now, own_cpu_s: 1)
        g.tick()
        assert torch.get_num_threads() == 1 and g.current == 1 and g.active
        torch.set_num_threads(2)  # an exact count asked for elsewhere (--threads)
        g.tick()
        assert not g.active and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_govern_is_a_no_op_without_a_governor_and_stop_governing_ends_it(monkeypatch):
    monkeypatch.setattr(threads, "GOVERNOR", threads.Governor(2, cpus={0, 1}))
    ticks = []
    monkeypatch.setattr(threads.GOVERNOR, "tick", lambda: ticks.append(1))
    threads.govern()
    threads.stop_governing()
    threads.govern()
    assert ticks == [1] and threads.GOVERNOR is None
