"""The main job: ``posttrain pipeline`` (commands/pipeline.py) runs the recipe end to end on the
embedded model.

Stages:

1. **data**     — a generated arithmetic SFT set (column-by-column reasoning + ``Answer: N``) from the
                  train split, dev rows for its held-out loss, and test problems for the accuracy,
                  disjoint by construction (envs/splits.py, data/synthetic.py);
2. **before**   — the untouched model: held-out SFT loss and greedy answer accuracy, graded by the
                  math environment's verifier, split by operand size;
3. **sft**      — supervised fine-tuning (train/sft.py) on the generated set;
4. **after**    — the same measurements on the fine-tuned checkpoint;
5. **rlvr**     — GRPO (train/rl.py) from the SFT checkpoint on ``rl_mix``: by default ``arithmetic``,
                  the train split of the very problems the held-out accuracy measures asked in the
                  two wordings the SFT data never uses (``rl_phrasings``), and ``instruction``
                  (1-2 verifiable constraints, never demonstrated by the SFT rows): trial 11 of
                  docs/results/rlvr_vs_sft.md, where the reward beat more SFT on both. With
                  the reasoning-on prompt and the token budget of the measurement, and **the SFT
                  anchor** (``rl_sft_anchor``: each step also trains on 8 SFT rows, PPO-ptx), without
                  which RL un-taught the plain problems while it taught the reworded ones.
                  Tasks are drawn uniformly, or (``rl_curriculum: gaussian``) by the pass-rate
                  curriculum from a profile of the SFT checkpoint the stage writes first (its time
                  is the stage's, so the same-time control gets it too).
                  Validated greedily on ``rl_val_tasks`` held-out tasks per domain (per wording in
                  the report) at the first and last step when asked (off by default); measured on the held-out problems greedily
                  and as *sampled* accuracy (``eval_samples`` answers per problem at its temperature).
                  What is RL's in the gain and what is the anchor's SFT rows, and the runs that led
                  here (arithmetic alone never moved; ``mcq`` learned to answer "C"), are in
                  docs/results/pipeline.md. ``--no-rlvr`` skips it;
6. **after_rl** — the arithmetic measurements on the RL checkpoint;
   **sft_arm**, **tokens_arm** — the two equal-compute controls (experiments/evidence.py, on unless
                  ``--no-controls``): SFT continued from the SFT checkpoint on the same data for the
                  RLVR stage's time, and for as many target tokens as it trained on;
   **rft_arm** (on unless ``--quick`` or ``--no-controls``) — the rejection-sampling control: the RLVR stage again from the
                  SFT checkpoint, training on the samples the verifier passes (``algo.advantage: rft``);
   **test_<model>** — base (unless ``test_base=false``), SFT, RL and each control scored greedily on
                  the **test** split of the RLVR stage's environments (``rl_test_tasks`` each): the
                  report's *RL − SFT same time* / *RL − SFT same tokens* per domain, per wording and
                  pooled. The RL run's own validation reads **dev** (it keeps its best checkpoint by
                  it); the held-out problems of stages 2–6 and this table read **test**;
   **anchor_control** (``--anchor-control``) — the RLVR stage's SFT anchor alone (the same number
                  of rows of the same data at its lr, no reward), then **after_anchor_control**: what
                  in the stage's gain is the reward's?
7. **report**   — a table on stdout (each accuracy ± its standard error, each stage's paired gain
                  ± paired standard error on the same problems), ``report.json``, ``report.png``,
                  ``report.md`` (table, plots, noise, commands, run directories; pipeline_report.py)
                  and TensorBoard events under ``tb/``;
8. **distill** (``--distill``) — two RLVR specialists from the SFT checkpoint (math only, instruction
                  only; the other domains validated only), then multi-teacher on-policy distillation
                  of both into the SFT checkpoint (posttrain/distill); a table of every domain's
                  held-out reward for the base, each teacher and the student,
                  ``distill.json`` and ``distill.png``;
9. **rlhf** (``--rlhf``, opt-in) — a GenRM trained with GRPO on rule-built math preference pairs
                  (both orders) from the SFT checkpoint, then RLHF from the RLVR checkpoint (or the
                  SFT one) with that GenRM as the reward: ring comparisons, group length control;
                  the verifiers still validate. A table of held-out reward per domain and the mean
                  reply length before and after, ``rlhf.json`` (docs/rlhf.md);
10. **curation** (``--curation``) — generate-then-filter from the model itself with the math verifier,
                  then SFT on the curated rows vs SFT on the same number of unfiltered samples
                  (experiments/curation.py), and the held-out accuracy of both.

Every stage writes its result to ``<run_dir>/stages/<name>.json`` (with its wall time, CPU time
and load average); a re-run skips finished stages, and SFT and each RL run resume from their last
checkpoint, so an interrupted pipeline picks up where it stopped; Ctrl-C prints the stage it
stopped in and the command that resumes. ``--fresh`` starts over.

Sizes and measured times (CPU time, wall time, load average; three ``--quick`` seeds) are in
docs/results/pipeline.md; ``bench/pipeline.py`` reproduces them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from posttrain.configs.pipeline import PipelineConfig
from posttrain.experiments import evidence, pipeline_report, stages
from posttrain.experiments.pipeline_report import binomial_se, columns, subsets, validation_gains
from posttrain.experiments.stages import RL_INSTRUCTION, cached_stage, make_data, measure, run_sft


# The three-domain mix of the distill and RLHF stages (as in recipes/rlvr_cpu.yaml): arithmetic
# families only (what a 135M model can reach at all: a group whose rewards are all equal carries no
# GRPO signal), multiple choice, and 1-2 verifiable formatting constraints (reward 1 only when all
# of them hold). Their rollouts render the reasoning-off prompt.
RL_DOMAINS: dict[str, dict[str, Any]] = {
    "math": {"families": ["addition", "chain_sum", "multiplication", "mixed_arithmetic", "linear_equation"]},
    "mcq": {},
    "instruction": RL_INSTRUCTION,
}


def mix_envs(cfg: PipelineConfig, ratios: dict[str, float]) -> list[dict[str, Any]]:
    """The three-domain mix; a domain with ratio 0 is validated but not trained."""
    return [{"name": name, "args": args, "ratio": ratios.get(name, 0.0), "train_tasks": cfg.rl_train_tasks,
             "val_tasks": cfg.rl_mix_val_tasks} for name, args in RL_DOMAINS.items()]


def rlvr_envs(cfg: PipelineConfig) -> list[dict[str, Any]]:
    """The RLVR stage's environments (``cfg.rl_mix``): ``arithmetic`` is the pipeline's own problems
    (envs/arithmetic.py), the distribution its held-out accuracy measures, from the train split (the
    held-out problems are in the validation split by construction); the other domains are the
    three-domain runs' environments. Every domain is validated on ``rl_val_tasks`` held-out tasks."""
    envs = []
    for name, ratio in cfg.rl_mix.items():
        if name == "arithmetic":
            args = {"max_digits": cfg.max_digits, "min_digits": cfg.rl_min_digits, "phrasings": list(cfg.rl_phrasings)}
            envs.append({"name": "arithmetic", "args": args, "ratio": ratio,
                         "train_tasks": cfg.rl_arith_train_tasks, "task_seed": cfg.seed, "val_tasks": cfg.rl_val_tasks})
        else:
            args = RL_DOMAINS[name]
            if name == "math" and cfg.rl_math_families:
                args = {**args, "families": list(cfg.rl_math_families)}
            envs.append({"name": name, "args": args, "ratio": ratio, "train_tasks": cfg.rl_mix_train_tasks,
                         "task_seed": cfg.seed, "val_tasks": cfg.rl_val_tasks})
    return envs


def rl_overrides(cfg: PipelineConfig, out_dir: Path, model: str, steps: int, envs: list[dict[str, Any]],
                 rlvr_stage: bool = False, extra: Sequence[str] = ()) -> list[str]:
    """RLConfig overrides shared by every RL run of the pipeline (uniform task sampling, constant lr).
    The RLVR stage (``rlvr_stage``) samples like the pipeline measures: the reasoning-on prompt the
    SFT data taught, ``max_new_tokens`` of the held-out measurement, its own lr and batch; the
    distill/RLHF runs keep recipes/rlvr_cpu.yaml's reasoning-off settings. ``extra`` (the rejection-sampling
    control's advantage) comes after the stage's own settings and before ``cfg.rl_overrides``, which win."""
    if rlvr_stage:
        batch = [f"rollout.prompts_per_step={cfg.rl_prompts_per_step}", f"rollout.group_size={cfg.rl_group_size}",
                 f"rollout.batch_size={cfg.rl_prompts_per_step * cfg.rl_group_size}",
                 f"rollout.max_new_tokens={cfg.max_new_tokens}", f"rollout.temperature={cfg.rl_temperature}",
                 "rollout.reasoning=true", f"optim.lr={cfg.rl_lr}"]
        if cfg.rl_sft_anchor > 0:  # the SFT stage's data (make_data), beside the run directory
            data = out_dir.parent / "data" / "train.jsonl"
            batch += [f"algo.sft_anchor.data={json.dumps(str(data))}", f"algo.sft_anchor.coef={cfg.rl_sft_anchor}",
                      f"algo.sft_anchor.rows_per_step={cfg.rl_anchor_rows}"]
    else:
        batch = ["rollout.prompts_per_step=6", "rollout.group_size=6", "rollout.batch_size=36",
                 "rollout.max_new_tokens=96", "rollout.temperature=0.7",  # at 1.0 a 135M model's samples are mostly noise
                 "rollout.reasoning=false", f"optim.lr={cfg.rl_mix_lr}"]
    curriculum = ["curriculum.kind=random"]
    if rlvr_stage and cfg.rl_curriculum == "gaussian":  # run_rl_stage writes the profile first
        curriculum = ["curriculum.kind=gaussian", f"curriculum.profile={json.dumps(str(profile_path(out_dir)))}"]
    return [
        f"model={json.dumps(model)}", f"run_dir={json.dumps(str(out_dir))}", f"envs={json.dumps(envs)}",
        *curriculum, *batch, "optim.weight_decay=0", "optim.warmup_steps=0",
        "optim.decay_frac=0", f"train.steps={steps}", f"train.seed={cfg.seed}",
        # validation at the start and at the end only; none for an RLVR stage with rl_val_tasks=0
        f"train.eval_every={0 if rlvr_stage and not cfg.rl_val_tasks else steps}",
        f"train.save_every={max(2, steps // 2)}", "train.keep_last=1",
    ] + list(extra) + list(cfg.rl_overrides)


def profile_path(out_dir: Path) -> Path:
    """Where the RLVR stage's pass-rate profile goes: beside its run directory, not in it."""
    return out_dir.parent / f"{out_dir.name}_profile.jsonl"


def profile_pools(cfg: PipelineConfig, over: list[str]) -> dict[str, Any]:
    """The pass-rate profile the RLVR stage's curriculum samples from (``rl_curriculum: gaussian``):
    the start checkpoint's ``rl_profile_k`` samples on each of the first ``rl_profile_tasks`` tasks of
    every pool, with the RL run's own prompt, temperature and token budget (``posttrain profile``'s
    :func:`profile_envs`). Rewritten whenever the stage runs, so the stage's time always holds it.
    Returns, per environment, the mean pass rate and the shares never and always solved."""
    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig
    from posttrain.engines.registry import engine_for_spec
    from posttrain.eval.pass_rate_profile import profile_envs, summary
    from posttrain.serving.build import build_envs

    rl_cfg, t, cpu = load_config(RLConfig, None, over), time.time(), stages.cpu_seconds()
    r, path = rl_cfg.rollout, Path(rl_cfg.curriculum.profile)
    generator = engine_for_spec(rl_cfg.model, r.engine, r.batch_size)  # the RL stage's sampler precision
    rows = profile_envs(generator, build_envs(rl_cfg.envs),
                        [(s.name, cfg.rl_profile_tasks, s.task_seed) for s in rl_cfg.envs if s.ratio > 0],
                        cfg.rl_profile_k, r.temperature, r.max_new_tokens, r.reasoning, r.max_turns, out=str(path))
    del generator
    domains = {d: summary([row for row in rows if row.domain == d]) for d in sorted({row.domain for row in rows})}
    return {"path": str(path), "k": cfg.rl_profile_k, "domains": domains, "seconds": round(time.time() - t, 3),
            "cpu_seconds": round(stages.cpu_seconds() - cpu, 3)}


def validation_at(out_dir: Path, step: int) -> dict[str, float]:
    """Greedy validation reward per domain (and ``mean``) that an RL run logged at ``step``."""
    from posttrain.train.metrics import read_metrics

    row = next((r for r in read_metrics(out_dir) if r.get("step") == step and "val_reward" in r), {})
    out = {k.split("/", 1)[1]: v for k, v in row.items() if k.startswith("val_reward/")}
    if "val_reward" in row:
        out["mean"] = row["val_reward"]
    return out


# The rejection-sampling control (``rft_arm``): the RLVR stage with the advantage 1 on passing samples;
# a group whose samples all passed teaches too, so the dynamic filter is off.
RFT = ["algo.advantage={type: rft}", "algo.dynamic_filter=false"]


def run_rl_stage(cfg: PipelineConfig, out_dir: Path, model: str, steps: int, envs: list[dict[str, Any]],
                 teachers: dict[str, Any] | None = None, rlvr_stage: bool = False, extra: Sequence[str] = ()) -> dict[str, Any]:
    """A pipeline stage of RL: one GRPO run (``train_rl``, in process), or with ``teachers`` one MOPD
    run; an interrupted run resumes from its checkpoint. ``extra``: more RLConfig overrides
    (``rl_overrides``)."""
    from posttrain.configs import load_config

    over = rl_overrides(cfg, out_dir, model, steps, envs, rlvr_stage, extra)
    profile = profile_pools(cfg, over) if rlvr_stage and cfg.rl_curriculum == "gaussian" else None
    if teachers is None:
        from posttrain.configs.rl import RLConfig
        from posttrain.train.rl import train_rl

        res = train_rl(load_config(RLConfig, None, over))
    else:
        from posttrain.configs.distill import DistillConfig
        from posttrain.distill.stage import train_distill

        res = train_distill(load_config(DistillConfig, None, [f"teachers={json.dumps(teachers)}"] + over))
    return {"run_dir": str(out_dir), "checkpoint": str(res.checkpoint), "model": model, "steps": res.steps,
            "trained_domains": sorted(e["name"] for e in envs if e["ratio"] > 0), "val_tasks": cfg.rl_val_tasks,
            "val_start": validation_at(out_dir, 0), "val_end": validation_at(out_dir, res.steps),
            "val_gains": validation_gains(out_dir, res.steps),
            "anchor": ({"coef": cfg.rl_sft_anchor, "rows": cfg.rl_anchor_rows}
                       if rlvr_stage and cfg.rl_sft_anchor > 0 else None),
            "best_step": res.best_step, "best_val_reward": res.best_val_reward,
            "rewards_png": str(out_dir / "rewards.png"), "profile": profile}


def run_distill(cfg: PipelineConfig, run_dir: Path, sft: dict[str, Any]) -> dict[str, Any]:
    """Two specialists from the SFT checkpoint (math only, instruction only), then MOPD of both into
    the SFT checkpoint; each run is its own cached stage. Returns the runs and their held-out table."""
    runs = {}
    for domain in ("math", "instruction"):
        runs[domain] = cached_stage(run_dir, f"specialist_{domain}", lambda d=domain: run_rl_stage(
            cfg, run_dir / f"specialist_{d}", sft["checkpoint"], cfg.specialist_steps, mix_envs(cfg, {d: 1.0})))
    # mcq has no specialist: ratio 0 (validated only); its rollouts would go to the default teacher
    teachers = {"models": [{"name": f"{d}_rl", "model": runs[d]["checkpoint"], "domains": [d]} for d in runs],
                "default": "math_rl"}
    runs["student"] = cached_stage(run_dir, "mopd", lambda: run_rl_stage(
        cfg, run_dir / "mopd", sft["checkpoint"], cfg.distill_steps, mix_envs(cfg, {"math": 1.0, "instruction": 1.0}),
        teachers))
    return runs


def run_rlhf(cfg: PipelineConfig, run_dir: Path, sft: dict[str, Any], start: str) -> dict[str, Any]:
    """The GenRM (GRPO on math preference pairs, unless ``rlhf_judge`` or ``genrm_steps=0``), then
    RLHF from ``start`` with it as the judge; each is its own cached stage."""
    from posttrain.configs import load_config

    judge = cfg.rlhf_judge or sft["checkpoint"]
    genrm = None
    if cfg.rlhf_judge is None and cfg.genrm_steps:
        def train() -> dict[str, Any]:
            from posttrain.configs.rlhf import GenRMConfig
            from posttrain.train.rlhf import train_genrm

            out_dir = run_dir / "genrm"
            envs = [{"name": "genrm", "args": {"math_pairs": cfg.genrm_pairs}, "train_tasks": 2 * cfg.genrm_pairs,
                     "val_tasks": cfg.rl_mix_val_tasks}]
            over = [o for o in rl_overrides(cfg, out_dir, sft["checkpoint"], cfg.genrm_steps, mix_envs(cfg, {}))
                    if not o.startswith("envs=")]
            mine = [o for o in cfg.rlhf_overrides if not o.startswith(("judge.", "length_control."))]  # RLHF's own
            res = train_genrm(load_config(GenRMConfig, None, over + [f"envs={json.dumps(envs)}"] + mine))
            return {"checkpoint": str(res.checkpoint), "steps": res.steps, "val_start": validation_at(out_dir, 0),
                    "val_end": validation_at(out_dir, res.steps)}

        genrm = cached_stage(run_dir, "genrm", train)
        judge = genrm["checkpoint"]

    def rlhf() -> dict[str, Any]:
        from posttrain.configs.rlhf import RLHFConfig
        from posttrain.train.metrics import read_metrics
        from posttrain.train.rlhf import train_rlhf

        out_dir = run_dir / "rlhf"
        key = "judge.url" if judge.startswith(("http://", "https://")) else "judge.model"
        over = rl_overrides(cfg, out_dir, start, cfg.rlhf_steps, mix_envs(cfg, {d: 1.0 for d in RL_DOMAINS}))
        res = train_rlhf(load_config(RLHFConfig, None, over + [f"{key}={json.dumps(judge)}"] + cfg.rlhf_overrides))
        rows = [r for r in read_metrics(out_dir) if "response_tokens_mean" in r]
        return {"checkpoint": str(res.checkpoint), "judge": judge, "steps": res.steps, "val_tasks": cfg.rl_mix_val_tasks,
                "val_start": validation_at(out_dir, 0), "val_end": validation_at(out_dir, res.steps),
                "reply_tokens_first": rows[0]["response_tokens_mean"] if rows else None,
                "reply_tokens_last": rows[-1]["response_tokens_mean"] if rows else None,
                "judge_fallback_frac": [r.get("genrm_fallback_frac") for r in rows]}

    return {"genrm": genrm, "rlhf": cached_stage(run_dir, "rlhf", rlhf)}


def paired_lines(title: str, out_dir: Path, step: int) -> list[str]:
    """An RL-type run's validation gain at ``step`` over step 0, per domain and pooled, each ± its paired
    standard error (``validation_gains``, as the RLVR section shows it); none when the records are
    missing."""
    gains = validation_gains(out_dir, step)
    if not gains:
        return []
    return [f"  {title}:"] + [f"    {dom:14s} {_gain(g)}" for dom, g in gains.items()]


def rlhf_report(run_dir: Path, out: dict[str, Any]) -> str:
    r, g, nan = out["rlhf"], out["genrm"], float("nan")
    lines = ["", f"rlhf: {r['steps']} GRPO steps with the GenRM {r['judge']} as the reward; held-out verifier "
                 f"reward per domain (greedy, {r['val_tasks']} tasks each), step 0 → {r['steps']}:"]
    for dom, start in r["val_start"].items():
        lines.append(f"    {dom:14s} {start:6.3f} → {r['val_end'].get(dom, nan):6.3f}")
    first, last = (r[k] if r[k] is not None else nan for k in ("reply_tokens_first", "reply_tokens_last"))
    lines.append(f"  mean reply tokens in the batch: first step {first:.1f}, last {last:.1f}")
    lines += paired_lines(f"step {r['steps']} − step 0, paired per task", run_dir / "rlhf", r["steps"])
    if g:
        lines.append(f"  GenRM: {g['steps']} GRPO steps; held-out judgement reward {g['val_start'].get('mean', nan):.3f} → "
                     f"{g['val_end'].get('mean', nan):.3f} (1 = exact, 0 = format error)")
    (run_dir / "rlhf.json").write_text(json.dumps(out, indent=2))
    return "\n".join(lines)


# --------------------------------------------------------------------------- report


def _row(label: str, values: list[str], width: int = 14) -> str:
    return f"  {label:30s}" + "".join(f"{v:>{width}s}" for v in values)


def _pct(p: float, n: int) -> str:
    """``p`` as a percentage with its binomial standard error over ``n`` problems."""
    return f"{p:.1%}±{binomial_se(p, n):.1%}".replace("%±", "±")


def report(run_dir: Path, before: dict[str, Any], after: dict[str, Any], sft: dict[str, Any], total_s: float,
           rl: dict[str, Any] | None = None, after_rl: dict[str, Any] | None = None,
           arm: dict[str, Any] | None = None, after_arm: dict[str, Any] | None = None,
           ctrl: dict[str, Any] | None = None, after_ctrl: dict[str, Any] | None = None,
           tested: dict[str, Any] | None = None) -> str:
    """The stdout table (each accuracy ± its standard error), the paired gains of each stage, the test
    table of RL against its controls (``tested``, evidence.table), ``report.json`` and ``report.png``."""
    stage_s = sum(st.get("seconds", 0.0) for st in pipeline_report._stages(run_dir).values())
    cols = columns(before, after, after_rl, after_arm, after_ctrl)
    digits = sorted(set().union(*(c["accuracy_by_digits"] for _, c in cols)), key=int)
    n = before["n_eval"]
    gains = stage_gains(before, after, after_rl, after_arm, after_ctrl)
    lines = [
        "",
        "posttrain pipeline — what it achieved",
        "  model: " + "  →  ".join(c["model"] for _, c in cols),
        f"  SFT: {sft['steps']} steps, {sft['tokens_trained']} trained tokens",
    ]
    if rl:
        lines.append(f"  RLVR: {rl['steps']} GRPO steps on {', '.join(rl['trained_domains'])} from the SFT checkpoint"
                     + pipeline_report.anchor_phrase(rl) + pipeline_report.curriculum_phrase(rl))
    if arm:
        clock = arm.get("budget_clock", "seconds")
        what = "CPU s" if clock == "cpu_seconds" else "s"
        lines.append(f"  control, SFT same time: {arm['steps']} more SFT steps from the SFT checkpoint "
                     f"({arm.get(clock, arm['seconds']):.0f} {what}; the RLVR stage took "
                     f"{rl[clock] if rl else float('nan'):.0f} {what})")
    if ctrl:
        lines.append(f"  anchor alone: {ctrl['steps']} SFT steps of {ctrl['rows']} rows from the SFT checkpoint at "
                     f"lr {ctrl['lr']:g}: the RLVR stage's anchor without its reward")
    lines += [
        "",
        f"  {'metric':30s}" + "".join(f"{name:>14s}" for name, _ in cols),
        _row("held-out SFT loss", [f"{c['heldout_loss']:.3f}" for _, c in cols]),
        _row(f"answer accuracy (greedy, n={n})", [_pct(c["accuracy"], n) for _, c in cols]),
    ]
    for d in digits:
        lines.append(_row(f"  {d}-digit operands", [f"{c['accuracy_by_digits'].get(d, float('nan')):.1%}" for _, c in cols]))
    if any("sampled_accuracy" in c for _, c in cols):
        k, temp = next((c["sampled_k"], c["sampled_temperature"]) for _, c in cols if "sampled_accuracy" in c)
        lines.append(_row(f"sampled accuracy ({k} at T={temp:g})",
                          [f"{c['sampled_accuracy']:.1%}" if "sampled_accuracy" in c else "—" for _, c in cols]))
    lines += [
        _row("uses the answer format", [_pct(c["answer_format_rate"], n) for _, c in cols]),
        _row("mean reply tokens", [f"{c['mean_reply_tokens']:.1f}" for _, c in cols]),
        "",
        "  gains on the same held-out problems (± paired standard error; * = beyond 2 se):",
    ]
    for name, g in gains.items():
        lines.append(f"    {name:26s} accuracy {_gain(g['accuracy'])}   answer format {_gain(g['format'])}")
        if "sampled" in g:
            lines.append(f"    {'':26s} sampled  {_gain(g['sampled'])}")
    if rl and not rl["val_start"]:
        lines += ["", "  RLVR's own validation: off (rl_val_tasks=0); the test table below measures it"]
    elif rl:
        lines += ["", f"  RLVR held-out validation reward (greedy, {rl['val_tasks']} tasks per domain), "
                      f"step 0 → {rl['steps']}:"]
        gains_rl = rl.get("val_gains", {})
        for dom, start in rl["val_start"].items():
            g = gains_rl.get("all" if dom == "mean" else dom)  # the mean's gain: every task pooled
            paired = f"   gain {_gain(g)}" if g else ""
            lines.append(f"    {dom:14s} {start:6.3f} → {rl['val_end'].get(dom, float('nan')):6.3f}{paired}")
        for part, g in subsets(gains_rl).items():
            lines.append(f"    {part:22s} {g['before']:6.3f} → {g['after']:6.3f}   gain {_gain(g)}  ({g['n']} tasks)")
        lines.append(f"  RL curves: {rl['rewards_png']}")
        if "all without flagged" in gains_rl:
            g = gains_rl["all without flagged"]
            lines.append(f"    {'all without flagged':22s} {g['before']:6.3f} → {g['after']:6.3f}   gain {_gain(g)}")
        lines.append("  (that was the RL run's own validation, on dev: it chose the run's best checkpoint)")
    if tested:
        lines += [""] + evidence.lines(tested)
    lines += [
        "",
        f"  greedy decoding: held-out problems in fp32, test table in {(tested or {}).get('precision', 'fp32')} (eval_precision)",
        f"  {n} held-out problems; stages {stage_s / 60:.1f} min wall summed (this invocation {total_s / 60:.1f} min: "
        f"a resumed run reuses finished stages); report in {run_dir}/report.md",
    ]
    text = "\n".join(lines)
    (run_dir / "report.json").write_text(json.dumps({"before": before, "after": after, "sft": sft, "rl": rl,
                                                     "after_rl": after_rl, "sft_arm": arm, "after_sft_arm": after_arm,
                                                     "anchor_control": ctrl, "after_anchor_control": after_ctrl,
                                                     "gains": gains, "test": tested, "seconds": total_s}, indent=2))
    _plot(run_dir, cols, digits, rl)
    return text


def _gain(g: dict[str, Any]) -> str:
    star = "*" if abs(g["gain"]) > 2 * g["se"] else " "
    guess = (f"  † {100 * g['one_letter'][1]:.0f}% of answers {g['one_letter'][0]}: a constant guess, kept in the pooled figure"
             if "one_letter" in g else "")  # eval.compare.domain_gains
    return f"{g['gain']:+6.1%} ± {g['se']:.1%}{star} (+{g['gained']}/-{g['lost']}){guess}"


def stage_gains(before: dict[str, Any], after: dict[str, Any], after_rl: dict[str, Any] | None = None,
                after_arm: dict[str, Any] | None = None,
                after_ctrl: dict[str, Any] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Paired gains (eval/compare.py) on the per-problem results of two measurements: what SFT added
    over the base, what RL added over SFT, and RL against the longer-SFT arm and the anchor alone."""
    pairs = [("SFT (after SFT − before)", before, after)]
    if after_rl:
        pairs.append(("RL (after RL − after SFT)", after, after_rl))
    for label, other in (("longer SFT", after_arm), ("anchor alone", after_ctrl)):
        if other:
            pairs.append((f"{label} − after SFT", after, other))
            if after_rl:
                pairs.append((f"RL − {label}", other, after_rl))
    out = {}
    for name, a, b in pairs:
        if "per_task" not in a or "per_task" not in b:  # a stage cached before per-problem results existed
            continue
        out[name] = {key: _paired(a, b, key) for key in ("correct", "format")}
        out[name]["accuracy"] = out[name].pop("correct")
        if all("sampled" in t for t in a["per_task"] + b["per_task"]):  # pass@1 of k samples, per problem
            out[name]["sampled"] = _paired(a, b, "sampled")
    return out


def _paired(a: dict[str, Any], b: dict[str, Any], key: str) -> dict[str, Any]:
    from dataclasses import asdict

    from posttrain.eval.compare import paired_gain

    return asdict(paired_gain({t["id"]: t[key] for t in a["per_task"]}, {t["id"]: t[key] for t in b["per_task"]}))


def _plot(run_dir: Path, cols: list[tuple[str, dict[str, Any]]], digits: list[str], rl: dict[str, Any] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posttrain.train.metrics import read_metrics

    fig, axes = plt.subplots(1, 2 + bool(rl), figsize=(5 * (2 + bool(rl)), 3.6))
    ax1, ax2 = axes[0], axes[1]
    labels = ["all"] + [f"{d}-digit" for d in digits]
    width = 0.8 / len(cols)
    for i, (name, c) in enumerate(cols):
        ys = [c["accuracy"]] + [c["accuracy_by_digits"].get(d, 0) for d in digits]
        ax1.bar([x - 0.4 + width * (i + 0.5) for x in range(len(labels))], ys, width, label=name)
    ax1.set_xticks(list(range(len(labels))), labels)
    ax1.set_ylim(0, 1)
    ax1.set_title("held-out answer accuracy")
    ax1.legend()
    rows = read_metrics(run_dir / "sft")
    tr = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    va = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if tr:
        ax2.plot(*zip(*tr), label="train")
    if va:
        ax2.plot(*zip(*va), "o-", label="held-out")
    ax2.set_xlabel("step")
    ax2.set_title("SFT loss")
    if tr or va:  # a run whose SFT stage lives in another run directory has no curve here
        ax2.legend()
    if rl and rl["val_start"]:
        _bars(axes[2], {"step 0 (SFT)": rl["val_start"], f"step {rl['steps']}": rl["val_end"]},
              f"RLVR validation reward ({rl['val_tasks']} tasks/domain)")
    fig.tight_layout()
    fig.savefig(run_dir / "report.png", dpi=110)
    plt.close(fig)


def _bars(ax: Any, series: dict[str, dict[str, float]], title: str) -> None:
    """Grouped bars: one group per domain, one bar per series (a model or a step)."""
    domains = list(next(iter(series.values())))
    width = 0.8 / len(series)
    for i, (name, scores) in enumerate(series.items()):
        ax.bar([x - 0.4 + width * (i + 0.5) for x in range(len(domains))],
               [scores.get(d, 0.0) for d in domains], width, label=name)
    ax.set_xticks(list(range(len(domains))), domains)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=7)


def distill_report(run_dir: Path, runs: dict[str, dict[str, Any]], rl: dict[str, Any] | None) -> str:
    """Held-out validation reward per domain: the SFT checkpoint (the runs' step 0), each teacher, the
    RLVR run when it validated the same domains, and the MOPD student; ``distill.json``/``.png``."""
    student = runs["student"]
    cols = {"base (SFT)": student["val_start"], "math_rl": runs["math"]["val_end"],
            "instruction_rl": runs["instruction"]["val_end"]}
    if rl and set(student["val_start"]) <= set(rl["val_end"]):  # an RLVR run validated on the same domains
        cols["RLVR mix"] = rl["val_end"]
    cols["MOPD student"] = student["val_end"]
    nan = float("nan")
    lines = [
        "",
        f"distill (MOPD): held-out validation reward per domain (greedy, {student['val_tasks']} tasks each)",
        f"  {'domain':14s}" + "".join(f"{name:>15s}" for name in cols),
    ]
    for dom in student["val_start"]:
        lines.append(f"  {dom:14s}" + "".join(f"{v.get(dom, nan):15.3f}" for v in cols.values()))
    lines += [
        f"  math_rl: {runs['math']['steps']} GRPO steps on math only; instruction_rl: {runs['instruction']['steps']} "
        "on instruction only (other domains validated only)",
        f"  student: {student['steps']} MOPD steps from the SFT checkpoint, math → math_rl, instruction → "
        "instruction_rl; mcq is validated only",
        f"  details in {run_dir}/distill.json and distill.png; curves in {student['rewards_png']}",
    ]
    lines += paired_lines("MOPD student − base (SFT), paired per task", run_dir / "mopd", student["steps"])
    (run_dir / "distill.json").write_text(json.dumps({"validation": cols, "runs": runs}, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    _bars(ax, cols, "held-out validation reward: base, teachers, student")
    fig.tight_layout()
    fig.savefig(run_dir / "distill.png", dpi=110)
    plt.close(fig)
    return "\n".join(lines)


def run_pipeline(cfg: PipelineConfig, run_dir: Path, command: str) -> int:
    """Every stage ``cfg`` asks for, in ``run_dir`` (a finished stage is read back, not rerun), then
    the report; ``command`` is the one the report gives for rerunning it."""
    t0 = time.time()
    data = cached_stage(run_dir, "data", lambda: make_data(cfg, run_dir))
    before = cached_stage(run_dir, "before", lambda: measure(cfg, cfg.model, data))
    print(f"[pipeline] before: accuracy {before['accuracy']:.1%}, held-out loss {before['heldout_loss']:.3f}")
    sft = cached_stage(run_dir, "sft", lambda: run_sft(cfg, run_dir, data))
    after = cached_stage(run_dir, "after", lambda: measure(cfg, sft["checkpoint"], data, sampled=cfg.rlvr))
    rl = after_rl = arm = after_arm = ctrl = after_ctrl = tested = None
    if cfg.rlvr:
        rl = cached_stage(run_dir, "rlvr", lambda: run_rl_stage(cfg, run_dir / "rl", sft["checkpoint"], cfg.rl_steps,
                                                           rlvr_envs(cfg), rlvr_stage=True))
        after_rl = (cached_stage(run_dir, "after_rl", lambda: measure(cfg, rl["checkpoint"], data, sampled=True))
                    if cfg.rl_headline else None)
        models = {"base": cfg.model} if cfg.test_base else {}
        models.update(sft=sft["checkpoint"], rl=rl["checkpoint"])
        if cfg.sft_arm:  # the equal-compute controls (experiments/evidence.py)
            arm = cached_stage(run_dir, "sft_arm", lambda: run_sft_arm(cfg, run_dir, data, sft, rl))
            models["sft_arm"] = arm["checkpoint"]
            if cfg.rl_headline:  # the same-time control on the headline problems too: the SFT data's own
                # wording, which the test table lacks when the RLVR stage trains other wordings or domains
                after_arm = cached_stage(run_dir, "after_sft_arm", lambda: measure(cfg, arm["checkpoint"], data))
        if cfg.tokens_arm:
            tok = cached_stage(run_dir, "tokens_arm", lambda: run_tokens_arm(cfg, run_dir, data, sft, rl))
            models["tokens_arm"] = tok["checkpoint"]
        if cfg.rft_arm:
            rft = cached_stage(run_dir, "rft_arm", lambda: run_rl_stage(
                cfg, run_dir / "rft", sft["checkpoint"], cfg.rl_steps, rlvr_envs(cfg), rlvr_stage=True, extra=RFT))
            models["rft_arm"] = rft["checkpoint"]
        if cfg.anchor_control:
            ctrl = cached_stage(run_dir, "anchor_control", lambda: run_anchor_control(cfg, run_dir, data, sft))
            after_ctrl = cached_stage(run_dir, "after_anchor_control",
                                      lambda: measure(cfg, ctrl["checkpoint"], data, sampled=True))
        scored = {name: cached_stage(run_dir, f"{cfg.table_split}_{name}", lambda m=model, n=name: evidence.score_records(
            Path(rl["run_dir"]), m, run_dir / cfg.table_split / f"{n}.jsonl", cfg.rl_test_tasks, cfg.eval_batch_size,
            cfg.table_split, stages.eval_dtype(cfg)))
            for name, model in models.items()}
        tested = evidence.table(scored, Path(rl["run_dir"]))
        tested["precision"] = next(iter(scored.values())).get("precision", "fp32")  # every row decoded alike
    print(report(run_dir, before, after, sft, time.time() - t0, rl, after_rl, arm, after_arm, ctrl, after_ctrl, tested))
    sections: dict[str, str] = {}
    if cfg.distill:
        runs = run_distill(cfg, run_dir, sft)
        text = distill_report(run_dir, runs, rl)
        print(text)
        sections["distill"] = text
    if cfg.rlhf:
        text = rlhf_report(run_dir, run_rlhf(cfg, run_dir, sft, rl["checkpoint"] if rl else sft["checkpoint"]))
        print(text)
        sections["rlhf"] = text
    if cfg.curation:
        text = curation_section(cfg, run_dir)
        print(text)
        sections["curation"] = text
    md = pipeline_report.write(run_dir, cfg, command, sections)
    print(f"\n[pipeline] report: {md}; TensorBoard: tensorboard --logdir {run_dir / 'tb'}")
    return 0


def run_tokens_arm(cfg: PipelineConfig, run_dir: Path, data: dict[str, Any], sft: dict[str, Any],
                   rl: dict[str, Any]) -> dict[str, Any]:
    """The same-tokens control: continue SFT from the SFT checkpoint on as many target tokens as the
    RLVR stage trained on (``evidence.rl_trained_tokens``), with the same-time arm's data order and schedule."""
    tokens = evidence.rl_trained_tokens(Path(rl["run_dir"]))
    out = run_sft(cfg, run_dir, data, model=sft["checkpoint"], steps=evidence.tokens_budget(sft, tokens),
                  name="tokens_arm", seed=cfg.seed + 1, lr=cfg.tokens_control_lr or cfg.control_lr)
    return {**out, "target_tokens": tokens}


def run_sft_arm(cfg: PipelineConfig, run_dir: Path, data: dict[str, Any], sft: dict[str, Any],
                rl: dict[str, Any]) -> dict[str, Any]:
    """The same-time control: continue SFT from the SFT checkpoint for the RLVR stage's time: as many steps as fit at the
    SFT stage's measured pace (model loading and held-out loss included, as the RL stage's time
    includes its loading and validation). The budget is the stages' CPU time when both recorded it:
    on an idle machine it matches their wall times (both stages run the same threads), and on a
    shared one a wall-clock budget would count the other jobs' time — and hand the arm steps the RL
    stage never had. A new data order (seed + 1) and a new warmup-stable-decay cycle at the SFT
    learning rate."""
    clock, pace, steps = arm_budget(sft, rl)
    out = run_sft(cfg, run_dir, data, model=sft["checkpoint"], steps=steps, name="sft_arm", seed=cfg.seed + 1,
                  lr=cfg.control_lr)
    return {**out, "budget_clock": clock, "target_seconds": rl[clock], "sft_seconds_per_step": round(pace, 3)}


def arm_budget(sft: dict[str, Any], rl: dict[str, Any]) -> tuple[str, float, int]:
    """(clock, SFT seconds per step, arm steps) for the longer-SFT arm: the RL stage's time over the SFT
    stage's pace (over the steps its invocation ran: a resumed SFT stage timed only those), on CPU
    time when both stages recorded some. A stage faster than the clock's
    resolution (a tiny model's two steps on a fast CPU record 0.0 s) counts as 1 ms a step rather
    than dividing by zero."""
    clock = "cpu_seconds" if sft.get("cpu_seconds") and rl.get("cpu_seconds") else "seconds"
    # a stage resumed from a checkpoint timed only the steps it ran (its clock restarted with the process)
    pace = max(sft[clock] / max(1, sft.get("steps_run", sft["steps"])), 1e-3)
    return clock, pace, max(1, round(rl[clock] / pace))


def run_anchor_control(cfg: PipelineConfig, run_dir: Path, data: dict[str, Any], sft: dict[str, Any]) -> dict[str, Any]:
    """The RLVR stage's SFT anchor without the reward: from the SFT checkpoint, ``rl_steps`` SFT steps
    of ``rl_anchor_rows`` conversations of the same data (the rows differ, the distribution and count
    do not), at the RL stage's constant lr with no weight decay, in fp32 as the RL stage computes. The anchor's weight
    (``rl_sft_anchor``) sets its share against the policy gradient inside the RL stage; alone it has no
    counterpart, because Adam divides each step by the gradient's running scale (a constant factor
    changes nothing but what gradient clipping and Adam's eps see)."""
    out = run_sft(cfg, run_dir, data, model=sft["checkpoint"], steps=cfg.rl_steps, name="anchor_control",
                  batch_size=cfg.rl_anchor_rows, lr=cfg.rl_lr, constant=True, precision="fp32", freeze_layers=0)
    return {**out, "rows": cfg.rl_anchor_rows, "lr": cfg.rl_lr}


def curation_section(cfg: PipelineConfig, run_dir: Path) -> str:
    from posttrain.experiments.curation import compare, curation_stage

    cur_dir = run_dir / "curation"
    cur = cached_stage(run_dir, "curation", lambda: curation_stage(
        cfg.model, cur_dir, 160, 4, 2, 0.9, 64, cfg.seed, max_digits=cfg.max_digits))
    if not cur["rows_curated"]:
        return (f"\ncuration: none of {cur['candidates_logged']} candidates passed the verifier and filters; "
                f"nothing to fine-tune on (drop counts in {cur['paths']['summary']})")
    cmp = compare(cfg.model, cur_dir, cur, 12, 8, 2e-4, cfg.n_eval, cfg.seed, max_digits=cfg.max_digits,
                  max_new_tokens=cfg.max_new_tokens)  # caches its own stages under curation/stages
    lines = [f"\ncuration: {cur['candidates_logged']} self-generated candidates → {cur['rows_curated']} curated rows; "
             f"SFT on them vs on {cur['rows_unfiltered']} unfiltered samples (same steps):"]
    for name in ("base", "unfiltered", "curated"):
        acc = cmp[name]["accuracy"]
        lines.append(f"  {name:12s} held-out accuracy {acc:6.1%} ± {binomial_se(acc, cmp[name]['n_eval']):.1%}")
    lines += curation_gains(cmp)
    return "\n".join(lines)


CURATION_PAIRS = {"curated − unfiltered": ("unfiltered", "curated"), "curated − base": ("base", "curated")}
"""What curation adds over as many unfiltered samples, and over the base model."""


def curation_pairs(cmp: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The curation section's paired accuracy gains on the same held-out problems (as every other gain
    in the report); none for a measurement cached before per-problem results existed."""
    return {label: _paired(cmp[a], cmp[b], "correct") for label, (a, b) in CURATION_PAIRS.items()
            if "per_task" in cmp[a] and "per_task" in cmp[b]}


def curation_gains(cmp: dict[str, dict[str, Any]]) -> list[str]:
    return [f"  {label:22s} accuracy {_gain(g)}" for label, g in curation_pairs(cmp).items()]
