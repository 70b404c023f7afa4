"""Does the reward earn its place? The RLVR stage against its equal-compute SFT controls, on ``test``.

A gain of RL over the SFT checkpoint says nothing about the reward: the stage also trains (its SFT
anchor's rows, and simply more steps). The control that matters is *the same start given the same
compute of the obvious alternative*: more SFT on the same data. Two controls, both from the SFT
checkpoint on the SFT stage's data and schedule:

* **same time** (``sft_arm``) — as many SFT steps as fit in the RLVR stage's time at the SFT stage's
  pace (``pipeline.arm_budget``);
* **same tokens** (``tokens_arm``) — as many SFT steps as it takes to train on as many target tokens
  as the RLVR stage trained on (its rollouts' policy-gradient tokens plus its anchor's rows:
  ``rl_trained_tokens``), at the SFT stage's tokens per step (``tokens_budget``).
* **same rollouts** (``rft_arm``, opt-in) — rejection-sampling fine-tuning: the RLVR stage itself with
  the advantage 1 on the samples the verifier passes and 0 on the rest (``algos.advantages.rft``):
  the same prompts, samples per prompt, steps, anchor and lr, so about the same compute; what the
  group-relative signal adds over keeping what passes. Not SFT on the same data: new demonstrations
  the model made itself.

Every checkpoint (base, SFT, RL, each control) is then scored greedily on the **test** split of the
RLVR stage's own environments (``rl_test_tasks`` each, the rollout's prompt and token budget;
``train.validation.validate`` on ``test``), and compared task by task (``eval.compare.domain_gains``:
per domain, per wording of the arithmetic problems, pooled; a collapsed multiple-choice domain is
flagged and stays in the pooled figure). Nothing is chosen on these figures: the RL run keeps its
checkpoint by its dev validation, and the pipeline reports its last one.

A second opinion no one here wrote: where the RLVR stage trains the ``instruction`` domain, every
checkpoint's test answers there are graded again by the reference IFEval checkers of ``if-verifiable``
(``external_records``; eval/benchmarks/ifeval.py maps each of our constraints to its checks), and the
same comparisons are made on that grade: the ``external`` part of the table, with the share of tasks
on which the two graders agree. Where it trains ``arithmetic`` or ``math``, those answers are graded
again by Math-Verify with its own answer extraction (``numeric_records``,
eval/benchmarks/mathverify.py): the ``math_verify`` part, in the same shape.

What a lazy policy earns is beside every numeric figure: ``constant_answer`` (one number every time:
GCD's 1) and ``shortcuts`` (per math family, answers that need less than its skill, such as LCM's
larger number: how often each is right, how often each checkpoint gives it, and the scores on the
questions none of them answers). A figure a lazy answer can pay for is flagged, never dropped.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from posttrain.eval.compare import record_gains

CONTROLS = {"sft_arm": "SFT same time", "tokens_arm": "SFT same tokens", "rft_arm": "RFT same rollouts"}
"""Control stage name → its column in the test table."""


def rl_trained_tokens(rl_dir: Path) -> int:
    """Target tokens the RL run trained on: each step's policy-gradient tokens and anchor rows' tokens."""
    from posttrain.train.metrics import read_metrics

    rows = [r for r in read_metrics(rl_dir) if "tokens_in_batch" in r]
    return int(sum(r["tokens_in_batch"] + r.get("anchor_tokens", 0.0) for r in rows))


def tokens_budget(sft: dict[str, Any], tokens: int) -> int:
    """SFT steps that train on about ``tokens`` target tokens at the SFT stage's tokens per step (>= 1)."""
    per_step = max(sft["tokens_trained"] / max(sft["steps"], 1), 1.0)
    return max(1, round(tokens / per_step))


def score_records(rl_dir: Path, model: str, out: Path, n_tasks: int, batch_size: int,
                 split: str = "test", dtype: str = "fp32") -> dict[str, Any]:
    """Greedy rewards of ``model`` on ``n_tasks`` test tasks (``split``: dev for a run that chooses a
    setting) of each of the RL run's environments, with the run's prompt and token budget; per-task
    records in ``out`` (``validate``'s JSONL). ``dtype``: the precision of the greedy decoding (bf16:
    faster, slightly different; compare only checkpoints scored alike)."""
    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig
    from posttrain.engines.hf import HFGenerator
    from posttrain.serving.build import build_envs
    from posttrain.train.validation import validate

    rl_cfg = load_config(RLConfig, rl_dir / "config.yaml", [])
    gen = HFGenerator.from_spec(model, batch_size=batch_size, dtype=dtype, greedy_in_dtype=True)
    scores = validate(gen, build_envs(rl_cfg.envs), rl_cfg, out, split=split, n_tasks=n_tasks)
    return {"model": model, "records": str(out), "n_tasks": n_tasks, "split": split, "precision": gen.precision,
            "mean": {k.split("/", 1)[1]: v for k, v in scores.items() if k.startswith("val_reward/")}}


EXTERNAL_ENV = "instruction"
"""The domain a reference grader reads again (IFEval's checkers, ``external_records``)."""


def external_records(rl_dir: Path, records: Path, split: str, n_tasks: int) -> Path | None:
    """The ``instruction`` answers of ``records`` graded again by the reference IFEval checkers
    (``external_grades``), as a records file beside it (``<name>.ifeval.jsonl``). None when the RL run
    has no instruction environment, or the records carry no answers (written before they did)."""
    rows = [r for r in map(json.loads, records.read_text().splitlines()) if r.get("env") == EXTERNAL_ENV]
    if not rows or any(r.get("answer") is None for r in rows):
        return None
    tasks = scored_tasks(rl_dir, EXTERNAL_ENV, split, n_tasks)
    path = records.with_suffix(".ifeval.jsonl")
    path.write_text("".join(json.dumps(row) + "\n" for row in external_grades(rows, tasks)))
    return path


def scored_tasks(rl_dir: Path, env_name: str, split: str, n_tasks: int) -> dict[str, Any]:
    """Task id → task, for the ``n_tasks`` tasks of the RL run's environment ``env_name`` that
    ``score_records`` (``validate``) drew on ``split``; empty when the run has no such environment."""
    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig
    from posttrain.envs.base import make_env

    rl_cfg = load_config(RLConfig, rl_dir / "config.yaml", [])
    spec = next((e for e in rl_cfg.envs if e.name == env_name), None)
    if spec is None:
        return {}
    env = make_env(spec.name, **spec.args)  # in process: only its tasks are needed
    return {t.id: t for t in env.tasks(split, n_tasks, spec.task_seed)}


def numeric_records(rl_dir: Path, records: Path, split: str, n_tasks: int) -> Path | None:
    """The ``arithmetic`` and ``math`` answers of ``records`` graded again by Math-Verify
    (eval/benchmarks/mathverify.py), as a records file beside it (``<name>.mathverify.jsonl``). None
    when the RL run has neither environment, or the records carry no answers."""
    from posttrain.eval.benchmarks import mathverify

    rows = [r for r in map(json.loads, records.read_text().splitlines()) if r.get("env") in mathverify.ENVS]
    if not rows or any(r.get("answer") is None for r in rows):
        return None
    path = records.with_suffix(".mathverify.jsonl")
    path.write_text("".join(json.dumps(row) + "\n" for row in mathverify.regrade(rows, references(rl_dir, split, n_tasks))))
    return path


@functools.lru_cache(maxsize=8)
def references(rl_dir: Path, split: str, n_tasks: int) -> dict[str, str]:
    """Task id → reference answer of the RL run's arithmetic and math tasks on ``split``: drawn once
    per table, not once per checkpoint (a run's config does not change while its table is built)."""
    from posttrain.eval.benchmarks.mathverify import ENVS

    return {tid: str(t.ground_truth) for name in ENVS for tid, t in scored_tasks(rl_dir, name, split, n_tasks).items()}


def constant_answers(models: dict[str, dict[str, Any]], rl_dir: Path, split: str, n_tasks: int) -> dict[str, Any]:
    """What a lazy policy earns on each numeric domain (``arithmetic``, ``math``): the share of its test
    tasks whose reference is the single most common answer (a policy that always gives that number
    scores exactly this), and per checkpoint its most common final answer (``extract_math_answer``),
    that answer's share of its replies and its score. A checkpoint that scores no more than the
    constant is ``flagged``: its figure there is no evidence of a skill (the math domain's GCD
    questions have the answer 1 about two times in five, and an RL stage learned to answer 1). The
    figure stays in every comparison; the report prints the flag beside it."""
    from collections import Counter

    from posttrain.envs.extract import extract_math_answer
    from posttrain.eval.benchmarks.mathverify import ENVS

    refs = references(rl_dir, split, n_tasks)
    out: dict[str, Any] = {}
    for env in ENVS:
        rows = {name: [r for r in map(json.loads, Path(m["records"]).read_text().splitlines()) if r.get("env") == env]
                for name, m in models.items()}
        golds = Counter(refs[r["task_id"]] for r in next(iter(rows.values()), []) if r["task_id"] in refs)
        if not golds:
            continue
        answer, count = golds.most_common(1)[0]
        n = sum(golds.values())
        per = {}
        for name, rs in rows.items():
            if not rs:  # a checkpoint scored without this domain: nothing to say about it
                continue
            said = Counter(a.text if (a := extract_math_answer(r.get("answer") or "")) else "" for r in rs)
            modal, k = said.most_common(1)[0]
            score = sum(r["reward"] for r in rs) / len(rs)
            per[name] = {"answer": modal, "share": k / len(rs), "score": score, "flagged": score <= count / n}
        out[env] = {"constant": {"answer": answer, "score": count / n, "n": n}, "models": per}
    return out


def shortcut_answers(models: dict[str, dict[str, Any]], rl_dir: Path, split: str, n_tasks: int) -> dict[str, Any]:
    """What answers that need less than the skill earn on each math family that has them
    (``envs.math_env.SHORTCUTS``: LCM's product and larger number, GCD's 1 and smaller number): per
    family, the share of its test tasks each shortcut gets right; per checkpoint, the share of its
    replies that give each shortcut's answer, its score on the family, and its score on the tasks no
    shortcut gets right (``beyond``: the only part of the figure a shortcut cannot pay for), with RL
    against each other checkpoint there, paired per task. Empty when the run trains no such family."""
    from dataclasses import asdict

    from posttrain.envs.math_env import SHORTCUTS, shortcuts_of
    from posttrain.eval.compare import paired_gain

    tasks = scored_tasks(rl_dir, "math", split, n_tasks)
    rows = {name: {r["task_id"]: r for r in map(json.loads, Path(m["records"]).read_text().splitlines())
                   if r.get("env") == "math"} for name, m in models.items()}
    out: dict[str, Any] = {}
    for family, cuts in SHORTCUTS.items():
        fam = {tid: t for tid, t in tasks.items() if t.metadata.get("family") == family}
        if not fam:
            continue
        said = {tid: shortcuts_of(t) for tid, t in fam.items()}
        pays = {tid: {name for name, a in said[tid].items() if a == t.ground_truth.strip()} for tid, t in fam.items()}
        beyond = {tid for tid, p in pays.items() if not p}
        per: dict[str, Any] = {}
        for name, rs in rows.items():
            got = {tid: r for tid, r in rs.items() if tid in fam}
            if not got:
                continue
            per[name] = {"n": len(got), "score": sum(r["reward"] for r in got.values()) / len(got),
                         "gives": {c: sum(_final_number(r) == said[tid][c] for tid, r in got.items()) / len(got) for c in cuts},
                         "beyond": {"n": sum(tid in beyond for tid in got),
                                    "score": _mean([r["reward"] for tid, r in got.items() if tid in beyond])}}
        rl = {tid: r["reward"] for tid, r in rows.get("rl", {}).items() if tid in beyond}
        vs = {f"RL − {COLUMNS[name]}": asdict(paired_gain({tid: r["reward"] for tid, r in rs.items() if tid in beyond}, rl))
              for name, rs in rows.items() if name != "rl" and rl and any(tid in beyond for tid in rs)}
        out[family] = {"n": len(fam), "pays": {c: sum(c in p for p in pays.values()) / len(fam) for c in cuts},
                       "n_beyond": len(beyond), "models": per, "beyond_comparisons": vs}
    return out


def _final_number(record: dict[str, Any]) -> str | None:
    """The number a record's reply gives as its final answer ("Answer: 1,260" → "1260"), or None."""
    from posttrain.envs.extract import extract_math_answer
    from posttrain.envs.math_env import number_core

    a = extract_math_answer(record.get("answer") or "")
    core = number_core(a.text) if a else None
    return core.replace(",", "") if core else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def external_grades(rows: list[dict[str, Any]], tasks: dict[str, Any]) -> list[dict[str, Any]]:
    """Per record (``env``, ``task_id``, ``answer``) of a task with at least one constraint IFEval has a
    checker for: ``reward`` 1 when every such constraint passes IFEval's strict check, ``ours`` 1 when
    our verifier passes the same constraints (the substance rule, which IFEval lacks, is not part of
    either), and which constraints IFEval failed."""
    from posttrain.envs.instruction.env import constraints_of, user_text
    from posttrain.eval.benchmarks.ifeval import compare_reply

    out = []
    for r in rows:
        task = tasks[r["task_id"]]
        graded = [c for c in compare_reply(constraints_of(task), r["answer"], user_text(task)) if c["reference"] is not None]
        if graded:
            ref, ours = all(c["reference"] for c in graded), all(c["ours"] for c in graded)
            out.append({"env": r["env"], "task_id": r["task_id"], "reward": float(ref), "ours": float(ours),
                        "reason": "" if ref else "ifeval: " + ", ".join(c["kind"] for c in graded if not c["reference"])})
    return out


def comparisons(models: dict[str, dict[str, Any]], key: str = "records") -> dict[str, dict[str, dict[str, Any]]]:
    """The paired comparisons of the test table, from the checkpoints scored (``score_records`` each):
    RL − SFT, RL − each control, each control − SFT, SFT − base (``key``: which records file)."""
    pairs = [("RL − SFT", "sft", "rl")]
    pairs += [(f"RL − {label}", name, "rl") for name, label in CONTROLS.items()]
    pairs += [(f"{label} − SFT", "sft", name) for name, label in CONTROLS.items()]
    pairs += [("SFT − base", "base", "sft")]
    return {title: record_gains(Path(models[a][key]), Path(models[b][key]))
            for title, a, b in pairs if a in models and b in models}


def table(models: dict[str, dict[str, Any]], rl_dir: Path | None = None) -> dict[str, Any]:
    """Per domain (and wording) and pooled: each checkpoint's mean test reward and the comparisons;
    with ``rl_dir``, also the instruction answers graded by IFEval's checkers (``external``) and the
    arithmetic and math answers by Math-Verify (``math_verify``)."""
    from posttrain.eval.benchmarks import mathverify

    first = next(iter(models.values()))
    out = {**_scored(models, "records"), "n_tasks": first["n_tasks"], "split": first.get("split", "test")}
    if rl_dir is not None:
        ext = {name: external_records(rl_dir, Path(m["records"]), out["split"], m["n_tasks"]) for name, m in models.items()}
        if all(ext.values()):
            graded = {name: {**m, "external": str(ext[name])} for name, m in models.items()}
            out["external"] = {**_scored(graded, "external"), "grader": "IFEval (if-verifiable)",
                               "agreement": {name: agreement(p) for name, p in ext.items() if p}}
        num = {name: numeric_records(rl_dir, Path(m["records"]), out["split"], m["n_tasks"]) for name, m in models.items()}
        if all(num.values()):
            graded = {name: {**m, "math_verify": str(num[name])} for name, m in models.items()}
            out["math_verify"] = {**_scored(graded, "math_verify"), "grader": mathverify.GRADER,
                                  "agreement": {name: agreement(p) for name, p in num.items() if p}}
            # the same condition: numeric domains whose records carry answers
            out["constant_answer"] = constant_answers(models, rl_dir, out["split"], first["n_tasks"])
            out["shortcuts"] = shortcut_answers(models, rl_dir, out["split"], first["n_tasks"])
    return out


def _scored(models: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    scores: dict[str, dict[str, float]] = {}
    for name, m in models.items():
        ref = record_gains(Path(m[key]), Path(m[key]))  # a model against itself: its means per row
        scores[name] = {row: g["after"] for row, g in ref.items()}
    return {"scores": scores, "comparisons": comparisons(models, key)}


def agreement(path: Path) -> dict[str, Any]:
    """Share of tasks on which a reference grader (IFEval's checkers, Math-Verify) and our verifier give
    the same verdict, and how many each passes alone (``external_records``, ``numeric_records``)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    same = sum(r["reward"] == r["ours"] for r in rows)
    return {"n": len(rows), "same": same, "rate": same / len(rows) if rows else None,
            "reference_only": sum(r["reward"] > r["ours"] for r in rows), "ours_only": sum(r["ours"] > r["reward"] for r in rows)}


COLUMNS = {"base": "base", "sft": "SFT", "rl": "SFT + RL", **CONTROLS}


def lines(t: dict[str, Any]) -> list[str]:
    """The report's test section on stdout: scores per row, then RL against each control; then the same
    answers as the second graders score them (IFEval's checkers, Math-Verify), where the table has them."""
    names = [n for n in COLUMNS if n in t["scores"]]
    chosen = "chosen on nothing" if t.get("split", "test") == "test" else "for choosing settings; not a reported figure"
    out = [f"  {t.get('split', 'test')} split (greedy, {t['n_tasks']} tasks per environment; {chosen}):",
           *_score_rows(t["scores"], names, list(next(iter(t["scores"].values()))))]
    for env, c in t.get("constant_answer", {}).items():
        const = c["constant"]
        out.append(f"  {env}: one constant answer ({const['answer']!r}) would score {const['score']:.3f} on these "
                   f"{const['n']} tasks; each checkpoint's most common answer:")
        out += [f"    {COLUMNS[n]:24s} {m['answer']!r} in {m['share']:.0%} of replies, score {m['score']:.3f}"
                + ("  flagged: no better than the constant (kept in every figure)" if m["flagged"] else "")
                for n, m in c["models"].items() if n in COLUMNS]
    for fam, c in t.get("shortcuts", {}).items():
        pays = ", ".join(f"{cut} {share:.0%}" for cut, share in c["pays"].items())
        out.append(f"  math · {fam}: shortcut answers right on these {c['n']} tasks: {pays}; "
                   f"{c['n_beyond']} tasks no shortcut answers. Per checkpoint, its replies giving each, score, score beyond:")
        out += [f"    {COLUMNS[n]:24s} " + ", ".join(f"{cut} {g:.0%}" for cut, g in m["gives"].items())
                + f"; {m['score']:.3f}; " + ("n/a" if m["beyond"]["score"] is None else f"{m['beyond']['score']:.3f}")
                for n, m in c["models"].items() if n in COLUMNS]
        out += [f"    {title:24s} beyond shortcuts {gain_text(g)}" for title, g in c["beyond_comparisons"].items()]
    for title, gains in t["comparisons"].items():
        if title.startswith("RL − "):
            out.append(f"  {title} (paired per task; * beyond 2 se):")
            out += [f"    {row:24s} {gain_text(g)}" for row, g in gains.items()]
    for part, what in (("external", f"{EXTERNAL_ENV} graded by {{}} (tasks with a mapped constraint"),
                       ("math_verify", "arithmetic and math graded by {}, its own answer extraction (")):
        second = t.get(part)
        if not second:
            continue
        rows = [EXTERNAL_ENV] if part == "external" else list(next(iter(second["scores"].values())))
        agree = "; ".join(f"{COLUMNS[n]} {a['same']}/{a['n']}" for n, a in second["agreement"].items())
        out.append(f"  {what.format(second['grader'])}{'; ' if part == 'external' else ''}graders agree: {agree}):")
        out += _score_rows(second["scores"], [n for n in names if n in second["scores"]], rows)
        for title, gains in second["comparisons"].items():
            if title.startswith("RL − "):
                out += [f"    {title:22s} {row:22s} {gain_text(gains[row])}" for row in rows if row in gains]
    return out


def _score_rows(scores: dict[str, dict[str, float]], names: list[str], rows: list[str]) -> list[str]:
    """A header of checkpoint names, then one line of mean rewards per row (domain, wording, pooled)."""
    out = [f"    {'':24s}" + "".join(f"{COLUMNS[n]:>16s}" for n in names)]
    for row in rows:
        out.append(f"    {row:24s}" + "".join(f"{scores[n].get(row, float('nan')):16.3f}" for n in names))
    return out


def gain_text(g: dict[str, Any]) -> str:
    star = "*" if abs(g["gain"]) > 2 * g["se"] else " "
    flag = ""
    if "one_letter" in g:
        flag = f"  flagged: {100 * g['one_letter'][1]:.0f}% of answers {g['one_letter'][0]} (a constant guess; kept in all)"
    elif "flagged" in g:
        flag = f"  (includes flagged {', '.join(g['flagged'])})"
    return f"{g['gain']:+.3f} ± {g['se']:.3f}{star} (+{g['gained']}/-{g['lost']}, {g['n']} tasks){flag}"


def headline(t: dict[str, Any], control: str = "RL − SFT same time") -> dict[str, Any] | None:
    """The pooled figure of one comparison (``all``, or the only domain when there is one)."""
    gains = t["comparisons"].get(control)
    if not gains:
        return None
    if "all" in gains:
        return gains["all"]
    domains = [k for k in gains if " · " not in k and k != "all without flagged"]
    return gains[domains[0]] if len(domains) == 1 else None
