"""Does curation pay? Rejection-sampled SFT data against the same model's unfiltered samples.

    python bench/curation_vs_unfiltered.py --run-dir runs/curation   # the embedded model, ~20 min

The experiment isolates the effect of the verifier and filters (docs/recipe.md §1) from the effect of
simply training on the model's own text:

1. ``curation_stage``: the model samples ``n_candidates`` replies to each of ``n_prompts`` arithmetic
   training problems (``data/synthetic.py``, split ``train``). Those candidates go through
   ``curate()`` unchanged — filters, the math verifier, dedup, at most ``k`` per prompt — into
   ``curated.jsonl``. Every candidate is also logged, before any check, to ``candidates.jsonl``;
   ``unfiltered.jsonl`` is a seeded random draw of *as many rows as curated.jsonl has* from that log.
   Both files therefore hold the same number of rows, sampled from the same model at the same
   temperature; the only difference is the selection.
2. ``compare``: the same base model is fine-tuned on each file with identical settings
   (``stages.run_sft``: same steps, batch size, lr, seed — so both see steps × batch examples), and
   base, SFT-unfiltered and SFT-curated are measured by ``stages.measure`` (greedy accuracy on
   held-out arithmetic problems, by operand size, answer-format rate, held-out SFT loss on the gold
   worked solutions).

Nothing here generates, verifies, filters or trains by itself: it wires ``HFGenerator``,
``GeneratingTeacherPool``, ``curate`` and the pipeline's SFT and measurement stages together.

Resuming: ``curate`` resumes ``curated.jsonl`` (done prompts are skipped and not sampled again), the
candidate log keeps the last generation of each prompt (a prompt redone after a kill is logged twice
and the earlier copy is ignored), and ``compare`` caches each stage's result in
``<run_dir>/stages/<name>.json`` exactly as ``posttrain pipeline`` does.

Unfiltered rows are the candidates as sampled, with the assistant text split into reasoning and
answer the same way curated rows are, so the two files render through the chat template alike.
Empty replies are left out of the draw: an assistant turn with no text is not a trainable row.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from posttrain.data.curate import Candidate, Row

CURATED, UNFILTERED, CANDIDATES, VALIDATION = "curated.jsonl", "unfiltered.jsonl", "candidates.jsonl", "validation.jsonl"


# --------------------------------------------------------------------------- candidate log


class LoggingTeacher:
    """Wraps a ``generate_fn``: every candidate is appended to a JSONL log (as an SFT row with
    provenance) before ``curate`` sees it, so the unfiltered set is drawn from exactly what was sampled."""

    def __init__(self, generate_fn: Any, log_path: Path) -> None:
        self.generate_fn = generate_fn
        self.log_path = log_path

    def __call__(self, tasks: list[Any]) -> list[list[Candidate]]:
        from posttrain.data.curate import append_block, build_row

        generated = self.generate_fn(tasks)
        rows = [build_row(t, c, f"{t.id}#cand.{j}", 0) for t, cands in zip(tasks, generated) for j, c in enumerate(cands)]
        append_block(self.log_path, rows)
        return generated


def read_candidates(path: Path) -> list[Row]:
    """The logged candidates; a prompt logged twice (redone after a kill) keeps its last generation."""
    if not path.exists():
        return []
    by_id: dict[str, Row] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a torn last line from a kill: that prompt is redone anyway
            continue
        by_id[row["id"]] = row
    return list(by_id.values())


def as_sft_row(candidate: Row) -> Row | None:
    """A logged candidate as a training row (reasoning split like curate does), or None if empty."""
    from posttrain.data.curate import _normalize_assistant

    n = candidate["provenance"]["prompt_messages"]
    generated = candidate["messages"][n:]
    if not any((m.get("content") or "").strip() for m in generated):
        return None
    return {**candidate, "messages": candidate["messages"][:n] + [_normalize_assistant(m) for m in generated]}


def draw_unfiltered(candidates: list[Row], n: int, seed: int) -> list[Row]:
    """``n`` rows drawn uniformly without replacement (seeded) from the non-empty candidates."""
    usable = [r for r in map(as_sft_row, sorted(candidates, key=lambda r: r["id"])) if r is not None]
    if n > len(usable):
        raise ValueError(f"asked for {n} unfiltered rows but only {len(usable)} non-empty candidates exist")
    return random.Random(seed).sample(usable, n)


class VerifyTimeout(Exception):
    pass


def bounded(verify_fn: Any, seconds: float = 5.0) -> Any:
    """``verify_fn`` with a wall-clock limit: a reply it cannot grade in time gets reward 0
    (``verify_timeout``). Why: ``math_env.number_core``'s trailing-unit regex backtracks
    exponentially on an answer line followed by a long run of words (seen on the embedded model's
    samples: one candidate hung for minutes). ``re`` checks for signals while matching, so SIGALRM
    interrupts it; off the main thread signals are unavailable and the verifier runs unbounded."""
    import signal
    import threading

    from posttrain.envs.base import VerifyResult

    def on_alarm(*_: Any) -> None:
        raise VerifyTimeout

    def verify(task: Any, messages: list[Any]) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return verify_fn(task, messages)
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return verify_fn(task, messages)
        except VerifyTimeout:
            return VerifyResult(0.0, {}, "verify_timeout")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return verify


def _totals(summary_file: Path) -> dict[str, Any]:
    """Counts over all curate runs into the output (a resumed run's summary holds only its own)."""
    s = json.loads(summary_file.read_text(encoding="utf-8"))
    runs = [*s.get("history", []), s]
    dropped: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    for r in runs:
        dropped.update(r["dropped"])
        rejected.update(r["rejected_reasons"])
    return {"candidates": sum(r["candidates"] for r in runs), "accepted": sum(r["kept"] for r in runs),
            "dropped": dict(dropped.most_common()), "rejected_reasons": dict(rejected.most_common(10)),
            "prompts_with_rows": sum(r["prompts_with_rows"] for r in runs),
            "prompts_skipped_done": s["prompts_skipped_done"]}


# --------------------------------------------------------------------------- stage 1: the two datasets


def curation_stage(
    model_spec: str,
    run_dir: str | Path,
    n_prompts: int,
    n_candidates: int,
    k: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    max_digits: int = 2,
    min_reward: float = 1.0,
    top_p: float = 1.0,
    batch_size: int = 32,
    num_threads: int | None = None,
    filters: Any = None,
) -> dict[str, Any]:
    """Self-rejection-sampling on arithmetic training problems → curated.jsonl and an equal-sized,
    unverified unfiltered.jsonl (see the module docstring). Resumes an interrupted run.

    Returns counts (candidates, accepted, dropped by reason, rows written) and the file paths.
    ``min_reward`` is curate's acceptance threshold (1.0: the answer must be right); ``filters`` a
    ``FiltersConfig`` (default: curate's stack).
    """
    from posttrain.data.conversations import write_jsonl
    from posttrain.configs.curate import CurateConfig
    from posttrain.data.curate import GeneratingTeacherPool, curate, summary_path
    from posttrain.data.synthetic import arithmetic_tasks
    from posttrain.envs.base import make_env
    from posttrain.engines.base import SamplingParams
    from posttrain.engines.hf import HFGenerator

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    curated, unfiltered, cand_log = run_dir / CURATED, run_dir / UNFILTERED, run_dir / CANDIDATES
    tasks = arithmetic_tasks(n_prompts, seed, "train", max_digits=max_digits)
    params = SamplingParams(n=n_candidates, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, seed=seed)
    # always resume: with no output yet it is a fresh run; with one, done prompts are skipped
    cfg = CurateConfig(out=curated, k=k, min_reward=min_reward, seed=seed, resume=True,
                       **({"filters": filters} if filters is not None else {}))

    generator: list[Any] = []  # the model loads only if some prompt still needs sampling

    def generate(chunk: list[Any]) -> list[list[Candidate]]:
        if not generator:
            generator.append(GeneratingTeacherPool([(model_spec, HFGenerator.from_spec(
                model_spec, batch_size=batch_size, num_threads=num_threads))], n_candidates, params))
        return generator[0](chunk)

    verify = bounded(make_env("math").verify)
    summary = curate(tasks, LoggingTeacher(generate, cand_log), verify, cfg)
    candidates = read_candidates(cand_log)
    totals = _totals(summary_path(curated))
    if totals["candidates"] != len(candidates):  # a killed run saves no summary: its counts are lost
        totals = {**recount(candidates, tasks, verify, cfg, run_dir / "recount" / CURATED), "recounted": True}

    n_rows = summary["rows_in_output"]
    write_jsonl(draw_unfiltered(candidates, n_rows, seed), unfiltered)
    logged = Counter(r["prompt_id"] for r in candidates)
    return {
        "model": model_spec,
        "sizes": {"n_prompts": n_prompts, "n_candidates": n_candidates, "k": k, "temperature": temperature,
                  "top_p": top_p, "max_new_tokens": max_new_tokens, "max_digits": max_digits,
                  "min_reward": min_reward, "seed": seed},
        **totals,
        "candidates_logged": len(candidates),
        "empty_candidates": sum(as_sft_row(r) is None for r in candidates),
        "prompts_logged": len(logged),
        "rows_curated": n_rows,
        "rows_unfiltered": n_rows,
        "candidate_accuracy": _candidate_accuracy(candidates, tasks),
        "paths": {"curated": str(curated), "unfiltered": str(unfiltered), "candidates": str(cand_log),
                  "summary": str(summary_path(curated))},
    }


def recount(candidates: list[Row], tasks: list[Any], verify: Any, cfg: Any, out: Path) -> dict[str, Any]:
    """Drop counts for every logged candidate, by replaying the log through ``curate`` into a
    scratch output (no sampling). Only needed after an interrupted run, whose summary was never
    written; the replay sees the prompts in order, so its global dedup may differ from the resumed
    run's by a row or so."""
    from collections import defaultdict

    from posttrain.data.curate import curate, done_path, summary_path

    by_prompt: dict[str, list[Row]] = defaultdict(list)
    for r in candidates:
        by_prompt[r["prompt_id"]].append(r)

    def replay(chunk: list[Any]) -> list[list[Candidate]]:
        out_: list[list[Candidate]] = []
        for t in chunk:
            rows = sorted(by_prompt[t.id], key=lambda r: int(r["id"].rsplit(".", 1)[1]))
            out_.append([Candidate(r["messages"][r["provenance"]["prompt_messages"]:], r["provenance"]["teacher"],
                                   r["provenance"]["sampling"], r["provenance"]["finish_reason"]) for r in rows])
        return out_

    for p in (out, done_path(out), summary_path(out)):
        p.unlink(missing_ok=True)
    curate([t for t in tasks if t.id in by_prompt], replay, verify,
           cfg.model_copy(update={"out": out, "resume": False}), log=lambda _: None)
    return _totals(summary_path(out))


def _candidate_accuracy(candidates: list[Row], tasks: list[Any]) -> float:
    """Share of sampled candidates whose answer the math verifier accepts (the raw pass rate)."""
    from posttrain.envs.base import make_env

    verify, by_id = bounded(make_env("math").verify), {t.id: t for t in tasks}
    graded = [verify(by_id[r["prompt_id"]], r["messages"][r["provenance"]["prompt_messages"]:]).reward
              for r in candidates if r["prompt_id"] in by_id]
    return sum(graded) / len(graded) if graded else 0.0


# --------------------------------------------------------------------------- stage 2: SFT on each, measure


def compare(
    model_spec: str,
    run_dir: str | Path,
    stage: dict[str, Any],
    steps: int,
    batch_size: int,
    lr: float,
    n_eval: int,
    seed: int,
    max_digits: int = 2,
    max_new_tokens: int = 64,
    n_val_rows: int = 32,
    eval_batch_size: int = 32,
) -> dict[str, Any]:
    """SFT ``model_spec`` on unfiltered.jsonl and on curated.jsonl with identical settings; measure
    base, SFT-unfiltered and SFT-curated on the same held-out problems. Stages are cached."""
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.experiments.stages import cached_stage, measure, run_sft

    run_dir = Path(run_dir)
    cfg = PipelineConfig(model=model_spec, run_dir=str(run_dir), seed=seed, n_eval=n_eval, n_val_rows=n_val_rows,
                         max_digits=max_digits, sft_steps=steps, sft_batch_size=batch_size, sft_lr=lr,
                         max_new_tokens=max_new_tokens, eval_batch_size=eval_batch_size)
    validation = run_dir / VALIDATION  # gold worked solutions of held-out problems: the SFT held-out loss
    if not validation.exists():
        write_jsonl(arithmetic_rows(n_val_rows, seed + 1, "dev", max_digits=max_digits), validation)
    results: dict[str, Any] = {"base": cached_stage(run_dir, "base", lambda: measure(cfg, model_spec, {"validation": str(validation)}))}
    for name in ("unfiltered", "curated"):
        data = {"train": stage["paths"][name], "validation": str(validation)}
        sft = cached_stage(run_dir / name, "sft", lambda: run_sft(cfg, run_dir / name, data))
        results[name] = cached_stage(run_dir, name, lambda: measure(cfg, sft["checkpoint"], data))
        results[name]["sft"] = sft
    return {"settings": cfg.model_dump(), "examples_seen_per_run": steps * batch_size, **results}
