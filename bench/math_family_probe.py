"""Which math families could an RLVR stage teach, and which does plain arithmetic SFT already reach?

    python bench/math_family_probe.py --model embedded --model runs/probe9/sft/checkpoints/step_000040

For each model and each reasoning-gym family of the math environment (envs/math_env.py ``FAMILIES``):
the pass rate on ``--tasks`` **dev** tasks, ``--k`` samples each at the RLVR stage's temperature,
token budget and reasoning-on prompt (recipes/pipeline_evidence_reach.yaml), and how many of those
tasks had unequal rewards among their samples (a GRPO group with equal rewards carries no signal).
Trial 9 of docs/results/rlvr_vs_sft.md chose its math families by it: the families where the SFT
checkpoint is not above the base and still passes some samples.

It also says what a lazy policy earns on each family's dev questions (``lazy_answers``, no model
needed): the share of the most common answer (what always giving it scores) and of each shortcut that
needs less than the skill (``envs.math_env.SHORTCUTS``). Trial 9 lacked this and was paid for "1" on
GCD and for the larger number on LCM; a family is now kept only where no lazy answer pays more than
``--max-lazy`` of its dev questions. Without ``--model`` the probe prints only that.

``--families instruction`` probes the pipeline's instruction domain beside them (1-2 verifiable
constraints, ``stages.RL_INSTRUCTION``, as the RLVR stage trains it): the same pass rates and reasons;
it has no numeric answer, so no lazy answer is computed for it. Nothing here reads test.

Appends one row per run to bench/results/math_family_probe.jsonl; ends with ``RESULT math_family_probe``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results_row import append_row, provenance  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "math_family_probe.jsonl"
INSTRUCTION = "instruction"  # not a math family: the pipeline's instruction domain


def probe(model: str, families: list[str], n: int, k: int, temperature: float, max_new_tokens: int) -> dict[str, dict]:
    """Family → pass rate, tasks with unequal rewards, and the reasons samples failed, for ``model``."""
    from posttrain.engines.hf import HFGenerator
    from posttrain.envs.base import make_env
    from posttrain.eval.evaluate import evaluate
    from posttrain.experiments.stages import RL_INSTRUCTION

    gen = HFGenerator.from_spec(model, batch_size=32, dtype="bf16")
    out = {}
    for fam in families:
        env = make_env("instruction", **RL_INSTRUCTION) if fam == INSTRUCTION else make_env("math", families=[fam])
        r = evaluate(gen, env, "dev", n, k=k, temperature=temperature,
                     max_new_tokens=max_new_tokens, seed=0, reasoning=True)
        rates = [sum(s.reward for s in t.samples) / len(t.samples) for t in r.tasks]
        reasons: dict[str, int] = {}
        for s in (s for t in r.tasks for s in t.samples):
            reasons[s.reason] = reasons.get(s.reason, 0) + 1
        out[fam] = {"pass": round(statistics.mean(rates), 3), "mixed_tasks": sum(0 < x < 1 for x in rates),
                    "tasks": len(rates), "reasons": reasons}
        print(f"{model}  {fam:<24} pass {out[fam]['pass']:.3f}  unequal-reward tasks {out[fam]['mixed_tasks']}/{len(rates)}", flush=True)
    return out


def lazy_answers(families: list[str], n: int) -> dict[str, dict]:
    """Family → the share of ``n`` dev questions whose reference is the most common answer, and the share
    each of its shortcuts gets right; ``best`` is the larger of them all."""
    from collections import Counter

    from posttrain.envs.math_env import SHORTCUTS, MathEnv, shortcuts_of

    out = {}
    for fam in (f for f in families if f != INSTRUCTION):
        tasks = MathEnv([fam]).tasks("dev", n, seed=0)
        answer, count = Counter(t.ground_truth.strip() for t in tasks).most_common(1)[0]
        said = [shortcuts_of(t) for t in tasks]
        cuts = {name: sum(a[name] == t.ground_truth.strip() for a, t in zip(said, tasks)) / len(tasks)
                for name in SHORTCUTS.get(fam, {})}
        out[fam] = {"tasks": len(tasks), "modal": answer, "modal_share": round(count / len(tasks), 3),
                    "shortcuts": {k: round(v, 3) for k, v in cuts.items()}, "best": round(max([count / len(tasks), *cuts.values()]), 3)}
        print(f"{fam:<24} most common answer {answer!r} {count / len(tasks):.1%}"
              + "".join(f", {k} {v:.1%}" for k, v in cuts.items()) + f"  ({len(tasks)} dev questions)", flush=True)
    return out


def main() -> None:
    from posttrain.envs.math_env import FAMILIES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[], help="'embedded' or a checkpoint; repeat for several "
                    "(none: only the lazy answers)")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=[*FAMILIES, INSTRUCTION])
    ap.add_argument("--tasks", type=int, default=24)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--lazy-tasks", type=int, default=300, help="dev questions per family for the lazy answers")
    ap.add_argument("--max-lazy", type=float, default=0.10, help="keep a family only where no lazy answer pays more")
    ap.add_argument("--no-record", action="store_true", help="print only; append no row")
    args = ap.parse_args()
    lazy = lazy_answers(args.families, args.lazy_tasks)
    rows = {m: probe(m, args.families, args.tasks, args.k, args.temperature, args.max_new_tokens) for m in args.model}
    if not args.no_record:
        append_row(RESULTS, {"models": rows, "lazy": lazy, "tasks": args.tasks, "k": args.k, "temperature": args.temperature,
                             "max_new_tokens": args.max_new_tokens, "max_lazy": args.max_lazy, **provenance("dev")})
    honest = [f for f in args.families if f not in lazy or lazy[f]["best"] <= args.max_lazy]
    if not args.model:
        print(f"RESULT math_family_probe: {len(honest)} families (dev, no lazy answer pays more than "
              f"{args.max_lazy:.0%}: {', '.join(honest) or 'none'})")
        return
    first, last = args.model[0], args.model[-1]
    kept = [f for f in honest if rows[last][f]["pass"] <= rows[first][f]["pass"] and rows[last][f]["mixed_tasks"] >= 2]
    print(f"RESULT math_family_probe: {len(kept)} families (dev, {last} not above {first}, with >= 2 tasks of "
          f"unequal rewards and no lazy answer paying more than {args.max_lazy:.0%}: {', '.join(kept) or 'none'})")


if __name__ == "__main__":
    main()
