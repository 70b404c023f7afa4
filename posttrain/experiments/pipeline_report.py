"""``runs/<name>/report.md`` and ``runs/<name>/tb/``: the pipeline's results for a person to read.

The report is rebuilt from the cached stage results (``stages/*.json``, ``report.json``) on every
run, so a resumed or re-run pipeline always shows all of its stages. It gives the table with the
noise of each figure (binomial standard error of each accuracy over the held-out problems, paired
standard errors of each stage's gain), the plots, each stage's wall time, CPU time and load
average, its run directory and the command that reproduces it alone.

TensorBoard: every stage that trained (SFT, RL, the longer-SFT arm, distill/RLHF runs) has its
``metrics.jsonl`` replayed into ``tb/<stage>/``, and the headline figures go to ``tb/pipeline/``
with the measured models in order as the step (0 base, 1 after SFT, 2 after RL, then the arms: longer
SFT, anchor alone).
Replaying, rather than logging live, keeps the events whole when a run was interrupted and resumed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from posttrain.configs.pipeline import PipelineConfig

# stage name → (run directory under the pipeline's, command that runs it alone from its saved config)
TRAINING_STAGES = {
    "sft": ("sft", "posttrain sft --config {d}/config.yaml"),
    "rlvr": ("rl", "posttrain rl --config {d}/config.yaml"),
    "sft_arm": ("sft_arm", "posttrain sft --config {d}/config.yaml"),
    "tokens_arm": ("tokens_arm", "posttrain sft --config {d}/config.yaml"),
    "anchor_control": ("anchor_control", "posttrain sft --config {d}/config.yaml"),
    "rft_arm": ("rft", "posttrain rl --config {d}/config.yaml"),
    "specialist_math": ("specialist_math", "posttrain rl --config {d}/config.yaml"),
    "specialist_instruction": ("specialist_instruction", "posttrain rl --config {d}/config.yaml"),
    "mopd": ("mopd", "posttrain distill --config {d}/config.yaml"),
    "genrm": ("genrm", "posttrain genrm --config {d}/config.yaml"),
    "rlhf": ("rlhf", "posttrain rlhf --config {d}/config.yaml"),
}
MEASURES = {"before": "the base model", "after": "the SFT checkpoint", "after_rl": "the RL checkpoint",
            "after_sft_arm": "the longer-SFT checkpoint", "after_anchor_control": "the anchor-alone checkpoint"}


def columns(before: dict[str, Any], after: dict[str, Any], after_rl: dict[str, Any] | None = None,
            after_arm: dict[str, Any] | None = None,
            after_ctrl: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The measured models in report order: base, SFT, RL, the longer-SFT arm, the anchor alone."""
    return ([("before", before), ("after SFT", after)] + ([("after RL", after_rl)] if after_rl else [])
            + ([("longer SFT", after_arm)] if after_arm else []) + ([("anchor alone", after_ctrl)] if after_ctrl else []))


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n > 1 else 0.0


def _stages(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((run_dir / "stages").glob("*.json"),
                                                               key=lambda p: p.stat().st_mtime)}


def _pm(p: float, n: int) -> str:
    return f"{p:.1%} ± {binomial_se(p, n):.1%}"


def write(run_dir: Path, cfg: PipelineConfig, command: str, sections: dict[str, str]) -> Path:
    """Write ``report.md`` (and the TensorBoard events, the resolved config); returns its path."""
    import yaml

    (run_dir / "pipeline.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    rep = json.loads((run_dir / "report.json").read_text())
    st = _stages(run_dir)
    cols = columns(rep["before"], rep["after"], rep.get("after_rl"), rep.get("after_sft_arm"), rep.get("after_anchor_control"))
    n = rep["before"]["n_eval"]
    digits = sorted(set().union(*(c["accuracy_by_digits"] for _, c in cols)), key=int)
    wall = sum(s.get("seconds", 0.0) for s in st.values())
    cpu = sum(s.get("cpu_seconds", 0.0) for s in st.values())
    L = [
        f"# posttrain pipeline: {run_dir.name}",
        "",
        f"```bash\n{command}   # resumes; add --fresh to start over\n```",
        "",
        f"Model `{cfg.model}`; resolved config: [pipeline.yaml](pipeline.yaml). Stage time summed over the "
        f"stages: **{wall / 60:.1f} min** wall, {cpu / 60:.1f} min CPU (this process, all threads) on "
        f"{os.cpu_count()} cores; 1-minute load average at each stage's start and end below (a load "
        "above the threads this run uses means the cores were shared and the wall time is inflated).",
        "",
        f"## Held-out arithmetic ({n} problems, greedy, graded by the math verifier)",
        "",
        "| metric | " + " | ".join(name for name, _ in cols) + " |",
        "|---|" + "---|" * len(cols),
        "| answer accuracy | " + " | ".join(_pm(c["accuracy"], n) for _, c in cols) + " |",
        "| uses the answer format | " + " | ".join(_pm(c["answer_format_rate"], n) for _, c in cols) + " |",
    ]
    if any("sampled_accuracy" in c for _, c in cols):
        k, temp = next((c["sampled_k"], c["sampled_temperature"]) for _, c in cols if "sampled_accuracy" in c)
        L.append(f"| sampled accuracy ({k} samples at T={temp:g}) | " + " | ".join(
            f"{c['sampled_accuracy']:.1%}" if "sampled_accuracy" in c else "—" for _, c in cols) + " |")
    for d in digits:
        L.append(f"| {d}-digit operands | " + " | ".join(
            f"{c['accuracy_by_digits'].get(d, float('nan')):.1%}" for _, c in cols) + " |")
    L += [
        "| held-out SFT loss | " + " | ".join(f"{c['heldout_loss']:.3f}" for _, c in cols) + " |",
        "| mean reply tokens | " + " | ".join(f"{c['mean_reply_tokens']:.1f}" for _, c in cols) + " |",
        "",
        "± is the binomial standard error over the problems. The gains below are paired: the same "
        "problems before and after, standard error of the per-problem differences "
        "(`posttrain validate --against` uses the same rule, eval/compare.py).",
        "",
        "| comparison | accuracy gain ± paired se | problems gained / lost | format gain ± paired se | beyond 2 se |",
        "|---|---|---|---|---|",
    ]
    for name, g in rep.get("gains", {}).items():
        a, f = g["accuracy"], g["format"]
        beyond = "yes" if abs(a["gain"]) > 2 * a["se"] else "no"
        L.append(f"| {name} | {a['gain']:+.1%} ± {a['se']:.1%} | {a['gained']} / {a['lost']} | "
                 f"{f['gain']:+.1%} ± {f['se']:.1%} | {beyond} |")
    sampled = {name: g["sampled"] for name, g in rep.get("gains", {}).items() if "sampled" in g}
    if sampled:
        L += ["", "Sampled accuracy: each problem answered "
              f"{k} times at the RLVR stage's temperature ({temp:g}), scored by the fraction right (pass@1 "
              "estimated from k samples, docs/recipe.md §7): the quantity GRPO raises. Greedy decoding picks "
              "each step's likeliest token, so sharpening the policy towards answers it already gives most "
              "often shows here before it changes a greedy answer.", "",
              "| comparison | sampled accuracy gain ± paired se | problems up / down | beyond 2 se |", "|---|---|---|---|"]
        for name, g in sampled.items():
            L.append(f"| {name} | {g['gain']:+.1%} ± {g['se']:.1%} | {g['gained']} / {g['lost']} | "
                     f"{'yes' if abs(g['gain']) > 2 * g['se'] else 'no'} |")
    rl = rep.get("rl")
    if rl:
        L += ["", f"## RLVR ({rl['steps']} GRPO steps on {', '.join(rl['trained_domains'])}{anchor_phrase(rl)})", ""]
        if rl.get("anchor"):
            L += ["The anchor's rows are supervised: part of the stage's gain, on the problems the SFT data asks "
                  "most of all, is theirs and not the reward's. " + (
                      "The section *The reward's share* below measures the anchor alone beside it"
                      if rep.get("anchor_control") else "`--anchor-control` measures the anchor alone beside it")
                  + "; the test table below compares it with more SFT for the same compute.", ""]
        if rl.get("profile"):
            L += [f"Tasks came from the pass-rate curriculum over {profile_phrase(rl['profile'])}.", ""]
        if rl["val_start"]:
            L += validation_rows(rl)
        else:
            L += ["It did not validate itself (`rl_val_tasks=0`): the test table below is its measure."]
        L += ["", f"![RL curves]({_rel(run_dir, rl['rewards_png'])})"]
    arm = rep.get("sft_arm")
    if rep.get("test") and rl:
        L += ["", f"## RL against equal-compute SFT, on {rep['test'].get('split', 'test')}", ""]
        if arm:
            L.append(f"*SFT same time* continues SFT from the SFT checkpoint for {arm['steps']} steps: as many as fit "
                     f"in the RLVR stage's {arm['target_seconds']:.0f} {_clock(arm)} at the SFT stage's pace of "
                     f"{arm['sft_seconds_per_step']} {_clock(arm)} a step; it took "
                     f"{st.get('sft_arm', {}).get(arm.get('budget_clock', 'seconds'), float('nan')):.0f} {_clock(arm)}.")
        tok = st.get("tokens_arm")
        if tok:
            L.append(f"*SFT same tokens* continues it for {tok.get('steps')} steps: {tok.get('tokens_trained')} "
                     f"target tokens against the RLVR stage's {tok.get('target_tokens')} (rollout + anchor tokens).")
        rft = st.get("rft_arm")
        if rft:
            L.append(f"*RFT same rollouts* reruns the RLVR stage from the SFT checkpoint ({rft.get('steps')} steps, the "
                     "same prompts, samples and anchor) training on the samples the verifier passed instead of the "
                     f"group-relative advantage; it took {rft.get('cpu_seconds', rft.get('seconds', float('nan'))):.0f} "
                     f"CPU s against the RLVR stage's {st.get('rlvr', {}).get('cpu_seconds', float('nan')):.0f}.")
        L += [""] + test_table_md(rep["test"])
    ctrl = rep.get("anchor_control")
    if ctrl and rl:
        L += ["", "## The reward's share: RL against its anchor alone", "",
              f"The control trains what the RLVR stage's anchor trains on, without the reward: {ctrl['steps']} SFT "
              f"steps of {ctrl['rows']} conversations of the same data from the SFT checkpoint, at the stage's lr "
              f"{ctrl['lr']:g}, constant, fp32. Same held-out problems (column *anchor alone*; gains *anchor alone − "
              "after SFT* and *RL − anchor alone*, the latter what the reward adds)."]
    L += ["", "![report](report.png)", ""]
    for name, text in sections.items():
        L += [f"## {name}", "", "```", text.strip("\n"), "```", ""]
        png = run_dir / f"{name}.png"
        if png.exists():
            L += [f"![{name}]({png.name})", ""]
    L += ["## Stages", "", "| stage | wall s | CPU s | load avg start → end | run directory | reproduce alone |",
          "|---|---|---|---|---|---|"]
    for name, s in st.items():
        load = s.get("load_avg")
        load_txt = f"{load[0]:.2f} → {load[1]:.2f}" if load else ""
        d, cmd = _where(run_dir, name, s)
        L.append(f"| {name} | {s.get('seconds', '')} | {s.get('cpu_seconds', '')} | {load_txt} | {d} | {cmd} |")
    L += ["", "Every stage's result is `stages/<stage>.json`; deleting one (and the stages after it) and "
              "re-running the command above redoes just those.", "",
          f"TensorBoard: `tensorboard --logdir {run_dir / 'tb'}` (training curves of every stage that trained, "
          "and the headline figures under `pipeline/`)."]
    export_tensorboard(run_dir, st, cols)
    out = run_dir / "report.md"
    out.write_text("\n".join(L) + "\n")
    return out


def test_table_md(t: dict[str, Any]) -> list[str]:
    """The test table (experiments/evidence.table) as markdown: scores, then each comparison per row."""
    from posttrain.experiments.evidence import COLUMNS

    names = [n for n in COLUMNS if n in t["scores"]]
    rows = list(t["scores"][names[0]])
    split = t.get("split", "test")  # table_split=dev: the table that settings are chosen on, labelled as such
    L = [f"Every checkpoint greedily on the **{split}** split of the RLVR stage's environments ({t['n_tasks']} tasks "
         "each, its prompt and token budget); " + ("nothing was chosen on these figures." if split == "test" else
                                                   "settings are chosen on these figures: not reported ones."), "",
         "| row | " + " | ".join(COLUMNS[n] for n in names) + " |", "|---|" + "---|" * len(names)]
    L += [f"| {row} | " + " | ".join(f"{t['scores'][n].get(row, float('nan')):.3f}" for n in names) + " |" for row in rows]
    L += ["", "| comparison | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    for title, gains in t["comparisons"].items():
        L.append(f"| {title} | " + " | ".join(
            f"{gains[r]['gain']:+.3f} ± {gains[r]['se']:.3f}{_star(gains[r])}" if r in gains else "" for r in rows) + " |")
    L += ["", f"± paired standard error over the same {split} tasks; \\* beyond two; † a constant multiple-choice "
          "guess, kept in *all*."]
    for env, c in t.get("constant_answer", {}).items():
        have = [n for n in names if n in c["models"]]
        L += ["", f"*{env}*: one constant answer (`{c['constant']['answer']}`) would score {c['constant']['score']:.3f} "
              f"on these {c['constant']['n']} tasks. Each checkpoint's most common answer, its share of replies and its "
              "score (⚑: no better than the constant; its figures above are no evidence of a skill there):", "",
              "| | " + " | ".join(COLUMNS[n] for n in have) + " |", "|---|" + "---|" * len(have),
              "| most common answer | " + " | ".join(f"`{c['models'][n]['answer']}` ({c['models'][n]['share']:.0%})"
                                                   for n in have) + " |",
              "| score | " + " | ".join(f"{c['models'][n]['score']:.3f}{' ⚑' if c['models'][n]['flagged'] else ''}"
                                      for n in have) + " |"]
    for fam, c in t.get("shortcuts", {}).items():
        have = [n for n in names if n in c["models"]]
        L += ["", f"*math · {fam}*: answers that need less than the skill are right on some of these {c['n']} tasks ("
              + ", ".join(f"{cut}: {share:.0%}" for cut, share in c["pays"].items())
              + f"); {c['n_beyond']} tasks no shortcut answers. Each checkpoint's share of replies giving each shortcut, "
              "its score, and its score where no shortcut is right:", "",
              "| | " + " | ".join(COLUMNS[n] for n in have) + " |", "|---|" + "---|" * len(have)]
        L += [f"| gives {cut} | " + " | ".join(f"{c['models'][n]['gives'][cut]:.0%}" for n in have) + " |" for cut in c["pays"]]
        L += ["| score | " + " | ".join(f"{c['models'][n]['score']:.3f}" for n in have) + " |",
              "| score beyond shortcuts | " + " | ".join(
                  "n/a" if (b := c["models"][n]["beyond"]["score"]) is None else f"{b:.3f}" for n in have) + " |", ""]
        L += [f"- {title}, beyond shortcuts: {g['gain']:+.3f} ± {g['se']:.3f}{_star(g)} ({g['n']} tasks)"
              for title, g in c["beyond_comparisons"].items()]
    ext = t.get("external")
    if ext:
        env = next(iter(next(iter(ext["scores"].values()))), "instruction")
        have = [n for n in names if n in ext["scores"]]
        L += ["", f"The same {env} answers graded by a second opinion, {ext['grader']}'s reference checkers (tasks with "
              "at least one constraint IFEval has a checker for; both graders on those constraints only):", "",
              "| | " + " | ".join(COLUMNS[n] for n in have) + " |", "|---|" + "---|" * len(have),
              f"| {env} (IFEval) | " + " | ".join(f"{ext['scores'][n].get(env, float('nan')):.3f}" for n in have) + " |",
              "| graders agree | " + " | ".join(f"{ext['agreement'][n]['same']}/{ext['agreement'][n]['n']}" for n in have) + " |",
              ""]
        L += [f"- {title}: {g[env]['gain']:+.3f} ± {g[env]['se']:.3f}{_star(g[env])}"
              for title, g in ext["comparisons"].items() if env in g]
    return L


def anchor_phrase(rl: dict[str, Any]) -> str:
    """How the RLVR stage kept the SFT data in its steps (``rl_sft_anchor``), or nothing when it did not."""
    a = rl.get("anchor")
    return f", each step also {a['rows']} SFT rows at weight {a['coef']:g} (the SFT anchor)" if a else ""


def curriculum_phrase(rl: dict[str, Any]) -> str:
    """The RLVR stage's pass-rate curriculum (``rl_curriculum: gaussian``) and its profile, or nothing."""
    return f"; pass-rate curriculum over {profile_phrase(rl['profile'])}" if rl.get("profile") else ""


def profile_phrase(p: dict[str, Any]) -> str:
    """The curriculum's profile: samples a task, per domain its pass rates, and what it cost."""
    doms = ", ".join(f"{d} {s['mean_pass_rate']:.2f} (never {s['never']:.0%}, always {s['always']:.0%})"
                     for d, s in p["domains"].items())
    return f"a profile of {p['k']} samples a task ({doms}), {p['cpu_seconds']:.0f} CPU s of the stage's time"


def _subset_rows(gains: dict[str, dict[str, Any]]) -> list[str]:
    """Table rows of a domain's parts (``subsets``): before and after are each gain's own."""
    return [f"| {part} ({g['n']} tasks) | {g['before']:.3f} | {g['after']:.3f} | {g['gain']:+.3f} ± {g['se']:.3f}{_star(g)} |"
            for part, g in subsets(gains).items()]


def _clock(arm: dict[str, Any]) -> str:
    """The arm's budget unit: CPU seconds (the default when both stages recorded them) or wall seconds."""
    return "CPU s" if arm.get("budget_clock") == "cpu_seconds" else "s"


def _star(g: dict[str, Any]) -> str:
    if "one_letter" in g:  # a constant guess (validation_gains): no gain to count
        return f" † ({100 * g['one_letter'][1]:.0f}% of answers {g['one_letter'][0]})"
    return "\\*" if abs(g["gain"]) > 2 * g["se"] else ""


def _rel(run_dir: Path, path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return path


def _where(run_dir: Path, name: str, s: dict[str, Any]) -> tuple[str, str]:
    if name in TRAINING_STAGES:
        sub, cmd = TRAINING_STAGES[name]
        d = run_dir / sub
        return f"[{sub}/]({sub}/)", f"`{cmd.format(d=d)}`"
    if name in MEASURES:
        return "", f"measures {MEASURES[name]} (`stages/{name}.json`; the pipeline re-runs it)"
    if name == "data":
        return "[data/](data/)", f"`posttrain make-data arithmetic --n {s.get('n_train')} ...` (the pipeline's seed)"
    return "", "the pipeline re-runs it"


def validation_gains(out_dir: Path, step: int, against: Path | None = None) -> dict[str, dict[str, Any]]:
    """Per domain, and pooled over every validated task (``all``), the paired gain ± paired standard
    error of an RL run's greedy validation at ``step`` over step 0 (or over the per-task file
    ``against``: another model on the same tasks), task by task from the run's own records (as
    ``posttrain validate --against`` computes it); empty when the records are missing. The pooled
    rule is ``eval.compare.domain_gains``'."""
    first = against or out_dir / "validation" / "step_000000.jsonl"
    last = out_dir / "validation" / f"step_{step:06d}.jsonl"
    if (against is None and step == 0) or not (first.is_file() and last.is_file()):
        return {}
    from posttrain.eval.compare import record_gains

    return record_gains(first, last)


def subsets(gains: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The gains of parts of a domain (``"<domain> · <part>"``, e.g. a wording of the arithmetic
    problems), listed after the domains' rows; each carries its own before and after."""
    return {k: g for k, g in gains.items() if " · " in k}


def export_tensorboard(run_dir: Path, st: dict[str, dict[str, Any]], cols: list[tuple[str, dict[str, Any]]]) -> None:
    """Replay every trained stage's metrics into ``tb/<stage>/`` and the headline figures into
    ``tb/pipeline/`` (rebuilt from scratch each time)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is a dependency; an environment without it still gets report.md
        print("[pipeline] note: tensorboard is not installed (pip install tensorboard); no tb/ events written")
        return
    from posttrain.train.metrics import read_metrics

    tb = run_dir / "tb"
    shutil.rmtree(tb, ignore_errors=True)
    for name in st:
        if name not in TRAINING_STAGES or not (run_dir / TRAINING_STAGES[name][0] / "metrics.jsonl").exists():
            continue
        w = SummaryWriter(str(tb / name))
        for row in read_metrics(run_dir / TRAINING_STAGES[name][0]):
            for k, v in row.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    w.add_scalar(k, v, row["step"])
        w.close()
    w = SummaryWriter(str(tb / "pipeline"))
    for i, (_, c) in enumerate(cols):
        w.add_scalar("heldout/accuracy", c["accuracy"], i)
        w.add_scalar("heldout/answer_format_rate", c["answer_format_rate"], i)
        w.add_scalar("heldout/sft_loss", c["heldout_loss"], i)
        w.add_scalar("heldout/mean_reply_tokens", c["mean_reply_tokens"], i)
    w.add_text("models", " → ".join(f"{i}: {name}" for i, (name, _) in enumerate(cols)))
    w.close()


def validation_rows(rl: dict[str, Any]) -> list[str]:
    """The RLVR run's own validation (dev split), step 0 → last, per environment, as markdown."""
    L = [f"Its own held-out validation (greedy, {rl['val_tasks']} tasks per environment), step 0 → "
         f"{rl['steps']}:", "", "| environment | step 0 | last step | gain ± paired se |", "|---|---|---|---|"]
    paired = rl.get("val_gains", {})  # computed once by the RLVR stage (pipeline.run_rl_stage)
    for dom, start in rl["val_start"].items():
        g = paired.get("all" if dom == "mean" else dom)  # the mean's gain: every task pooled
        L.append(f"| {dom} | {start:.3f} | {rl['val_end'].get(dom, float('nan')):.3f} | "
                 + (f"{g['gain']:+.3f} ± {g['se']:.3f}{_star(g)} |" if g else "|"))
    L += _subset_rows(paired)
    if "all without flagged" in paired:
        g = paired["all without flagged"]
        L.append(f"| all without flagged ({g['n']} tasks) | {g['before']:.3f} | {g['after']:.3f} | "
                 f"{g['gain']:+.3f} ± {g['se']:.3f}{_star(g)} |")
    return L + ["", "\\* beyond two paired standard errors. The mean's gain pools every validated task, a domain "
                "marked † included. † the multiple-choice answers at the last step sit on one letter: the score is "
                "a constant guess (chance on shuffled options); *all without flagged* shows the pool without it, "
                "beside the pooled figure, never instead of it. This validation reads the dev split: the run "
                "keeps its best checkpoint by it, so its figures are not the reported ones (the test table is)."]
