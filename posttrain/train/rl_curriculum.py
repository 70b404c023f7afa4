"""Which tasks an RL step trains on: the per-environment mix, the pass-rate curriculum, re-profiling.

:class:`TaskSchedule` wraps ``algos.curriculum`` (pure sampling maths) with what a run needs
around it: the training pools, the live profile (it changes when a plateau triggers
re-profiling), the progress of the curriculum's target mean, and its resume state.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from posttrain.configs import ConfigError
from posttrain.configs.rl import RLConfig


def check_profile(cfg: RLConfig) -> None:
    """``curriculum.profile`` names a file: checked before the model loads, so a typo costs a second."""
    p = cfg.curriculum.profile
    if p is None or Path(p).is_file():
        return
    what = "is a directory" if Path(p).is_dir() else "not found"
    raise ConfigError(f"curriculum.profile: {p} {what}: write it with `posttrain profile --config <this recipe> "
                      f"--out {p}`, or drop curriculum.profile to sample tasks uniformly")


def build_sampler(cfg: RLConfig, pools: dict[str, dict[str, Any]]) -> tuple[Any, Any]:
    """(DomainMixSampler, the curriculum or None) over the environments' training pools."""
    from posttrain.algos.curriculum import DomainMixSampler, RandomSampler, read_profile

    ratios = {s.name: s.ratio for s in cfg.envs}
    cur = cfg.curriculum
    if cur.profile is None:
        if cur.kind == "gaussian":
            print("[rl] no curriculum.profile: sampling tasks uniformly (run `posttrain profile` for the curriculum)")
        return DomainMixSampler(RandomSampler({n: list(p) for n, p in pools.items()}), ratios, cfg.train.seed), None
    rows = [r for r in read_profile(cur.profile) if r.domain in pools]
    unknown = [r.task_id for r in rows if r.task_id not in pools[r.domain]]
    if unknown:
        raise ConfigError(f"{cur.profile}: {len(unknown)} task ids (e.g. {unknown[0]!r}) are not in the training "
                          "pools; profile with the same --n and --seed as envs[].train_tasks / task_seed")
    if cur.kind == "random":
        return DomainMixSampler(RandomSampler.from_profile(rows), ratios, cfg.train.seed), None
    return curriculum_sampler(cfg, rows)


def curriculum_sampler(cfg: RLConfig, rows: list[Any]) -> tuple[Any, Any]:
    """(DomainMixSampler, GaussianCurriculum) from profile rows. Tasks at pass rate 1.0 are dropped,
    unless that leaves an environment fewer tasks than its share of a batch (then all are kept)."""
    from posttrain.algos.curriculum import DomainMixSampler, GaussianCurriculum, largest_remainder

    cur, ratios = cfg.curriculum, {s.name: s.ratio for s in cfg.envs}
    curriculum = GaussianCurriculum(rows, cur.mean_start, cur.mean_end, cur.std)
    need = largest_remainder(ratios, cfg.rollout.prompts_per_step)
    short = [n for n, k in need.items() if curriculum.sizes().get(n, 0) < k]
    if short:
        print(f"[rl] curriculum: {', '.join(short)} would have fewer unsolved tasks than a batch needs; "
              "keeping the always-solved tasks in the pool")
        curriculum = GaussianCurriculum(rows, cur.mean_start, cur.mean_end, cur.std, drop_solved=False)
    return DomainMixSampler(curriculum, ratios, cfg.train.seed), curriculum


class TaskSchedule:
    """The step's tasks, the curriculum metrics, and re-profiling on a plateau (``ReprofileConfig``)."""

    def __init__(self, cfg: RLConfig, envs: dict[str, Any]) -> None:
        from posttrain.algos.curriculum import PlateauDetector

        self.cfg = cfg
        self.pools = {s.name: {t.id: t for t in envs[s.name].tasks("train", s.train_tasks, s.task_seed)}
                      for s in cfg.envs}
        self.mix, self.curriculum = build_sampler(cfg, self.pools)
        rp = cfg.curriculum.reprofile
        # the live phase: which profile, from which step its target mean moves start → end
        self.phase: dict[str, Any] = {"profile": cfg.curriculum.profile, "start": 0, "plateau": []}
        self.detector = PlateauDetector(rp.window, rp.min_delta, rp.min_steps) if self.curriculum and rp.enabled else None

    def progress(self, step: int) -> float:
        return (step - self.phase["start"]) / max(self.cfg.train.steps - self.phase["start"], 1)

    def picks(self, step: int) -> list[tuple[str, Any]]:
        drawn = self.mix.sample(self.cfg.rollout.prompts_per_step, step, self.progress(step))
        return [(e, self.pools[e][t]) for e, t in drawn]

    def more(self, counts: dict[str, int], step: int, round: int) -> list[tuple[str, Any]]:
        """Fresh tasks for a refill round: ``counts[env]`` more of each environment."""
        drawn = self.mix.sample_counts(counts, step, self.progress(step), round=round)
        return [(e, self.pools[e][t]) for e, t in drawn]

    def metrics(self, step: int, task_ids: list[str], pass_rate: float) -> dict[str, float]:
        from posttrain.algos.curriculum import target_mean

        if self.curriculum is None:
            return {}
        cur = self.cfg.curriculum
        return {"pass_rate_gain": pass_rate - self.curriculum.expected_pass_rate(task_ids),
                "curriculum_target": target_mean(self.progress(step), cur.mean_start, cur.mean_end)}

    def maybe_reprofile(self, done: int, m: dict[str, Any], generator: Any, envs: dict[str, Any],
                        run_dir: Path) -> dict[str, float]:
        """Re-profile the pools with the live policy when the pass-rate gain has plateaued."""
        from posttrain.eval.pass_rate_profile import profile_envs

        if self.detector is None or done >= self.cfg.train.steps or not self.detector.update(m["pass_rate_gain"]):
            return {}
        rp, r = self.cfg.curriculum.reprofile, self.cfg.rollout
        path = run_dir / "profiles" / f"step_{done:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"\n[rl] step {done}: pass-rate gain plateaued; re-profiling the training pools (k={rp.k})")
        t0 = time.perf_counter()
        rows = profile_envs(generator, envs, [(s.name, s.train_tasks, s.task_seed) for s in self.cfg.envs], rp.k,
                            r.temperature, r.max_new_tokens, r.reasoning, r.max_turns, progress=False, out=str(path))
        self.mix, self.curriculum = curriculum_sampler(self.cfg, rows)
        self.phase.update(profile=str(path), start=done, plateau=[])
        return {"reprofiled": 1.0, "time_reprofile_s": time.perf_counter() - t0}

    def state_dict(self) -> dict[str, Any]:
        if self.detector is not None:
            self.phase["plateau"] = list(self.detector.values)
        return dict(self.phase)

    def load_state_dict(self, phase: dict[str, Any]) -> None:
        from posttrain.algos.curriculum import read_profile

        self.phase = phase
        if self.curriculum is not None and phase["profile"] != self.cfg.curriculum.profile:  # re-profiled before
            self.mix, self.curriculum = curriculum_sampler(self.cfg, read_profile(phase["profile"]))
        if self.detector is not None:
            self.detector.values = list(phase["plateau"])
