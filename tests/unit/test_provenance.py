"""Provenance of the bench figures (issue 34): every figure README.md and docs/benchmarks.md cite from
a bench has its row, and every bench that writes rows writes their provenance.

The citation convention (stated at the top of docs/benchmarks.md): a figure cites the row it comes from
with a Markdown link to that row, ``[FIGURE](bench/results/NAME.jsonl#L<n>)`` (from docs/:
``../bench/results/...``; ``#L<n>-L<m>`` for consecutive rows). Checked here, per citation: the file
exists; the lines exist and each is a JSON row; every number in the link's text is one of the cited
rows' numbers at the precision the text gives it, in the row's unit or scaled to the written one
(``SCALES``: × 100 for a percentage of a fraction, ÷ 10⁹ for GFLOP/s or GB/s, ÷ 2²⁰ for MiB; the sign
is not compared). A link whose text holds no number (``[row](...)``) vouches for the row's
existence only. A plain mention of ``bench/results/NAME.jsonl`` must name a file that exists.

Rows are history once written (bench/results_row.py): the first ``LEGACY[name]`` rows of a file were
written before every row had to carry ``command``, ``commit``, ``machine`` and ``split`` and may lack
them; every row after them must have them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.script_module import script_module

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md"]
RESULTS = ROOT / "bench" / "results"

# rows written before provenance was required (bench/results_row.py), per file: history, not rewritten
LEGACY = {
    "ab_versions.jsonl": 2, "curation_throughput.jsonl": 1, "dpo_tool_hallucination.jsonl": 1,
    "eval_batch.jsonl": 1, "gemm_shapes.jsonl": 4, "grpo_vs_trl.jsonl": 6, "pipeline.jsonl": 49,
    "precision.jsonl": 3, "quant_accuracy.jsonl": 2, "quantize.jsonl": 3, "rlhf_length_control.jsonl": 1,
    "rlhf_step.jsonl": 1, "rollout_throughput.jsonl": 4, "scale_rl.jsonl": 21, "sft_throughput.jsonl": 7,
    "sharded_trainer.jsonl": 3, "teacher_scoring.jsonl": 1, "threads.jsonl": 6, "verify_throughput.jsonl": 2,
    "vllm_vs_hf.jsonl": 2,
}

MENTION = re.compile(r"(?:\.\./)?bench/results/([\w.-]+\.jsonl)(?:#L(\d+)(?:-L(\d+))?)?")
LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\((?:\.\./)?bench/results/([\w.-]+\.jsonl)(?:#L(\d+)(?:-L(\d+))?)?\)")
SCALES = (1.0, 100.0, 1e-9, 2.0**-20)  # as recorded, a percentage of a fraction, giga-, mebi-
NUMBER = re.compile(r"(?<![\w.])[-+−]?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?)(?:[eE]([-+]?\d+))?(?![\w.])")


def numbers(obj: object) -> list[float]:
    """Every number of a JSON row (booleans are not numbers)."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [float(obj)]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in numbers(v)]
    return []


def figures(text: str) -> list[tuple[str, float, int, bool]]:
    """The numbers of a link text: (as written, |value|, decimals, scientific)."""
    out = []
    for m in NUMBER.finditer(text):
        mantissa, decimals, exponent = m.group(1).replace(",", ""), m.group(2), m.group(3)
        value = float(mantissa) * (10 ** int(exponent) if exponent else 1)
        out.append((m.group(0), value, len(decimals or ""), exponent is not None))
    return out


def in_row(figure: tuple[str, float, int, bool], values: list[float]) -> bool:
    """Whether ``figure`` is one of ``values`` at its written precision (in one of ``SCALES``)."""
    _, x, decimals, scientific = figure
    for v in values:
        for w in (abs(v * k) for k in SCALES):
            if not math.isfinite(w):
                continue
            if scientific:
                if w and float(f"{w:.{decimals}e}") == x:
                    return True
            elif abs(round(w, decimals) - x) < 0.5 * 10 ** -(decimals + 3):
                return True
    return False


def rows_of(name: str) -> list[str]:
    return (RESULTS / name).read_text().splitlines()


def citation_errors(doc: Path) -> list[str]:
    """What is wrong with the bench citations of one document (the module docstring's rules)."""
    text = doc.read_text()
    errors = []
    where = lambda pos: f"{doc.name}:{text.count(chr(10), 0, pos) + 1}"  # noqa: E731
    for m in MENTION.finditer(text):
        name, first, last = m.group(1), m.group(2), m.group(3)
        if not (RESULTS / name).is_file():
            errors.append(f"{where(m.start())}: bench/results/{name} does not exist")
            continue
        if first:
            lines = rows_of(name)
            for n in range(int(first), int(last or first) + 1):
                if not 1 <= n <= len(lines):
                    errors.append(f"{where(m.start())}: {name} has no line {n} ({len(lines)} lines)")
                    continue
                try:
                    if not isinstance(json.loads(lines[n - 1]), dict):
                        raise ValueError
                except ValueError:
                    errors.append(f"{where(m.start())}: {name} line {n} is not a JSON row")
    for m in LINK.finditer(text):
        label, name, first, last = m.groups()
        if not (RESULTS / name).is_file() or not first:
            if figures(label) and (RESULTS / name).is_file():
                errors.append(f"{where(m.start())}: [{label}] cites {name} without a row (#L<n>)")
            continue
        lines = rows_of(name)
        cited = [lines[n - 1] for n in range(int(first), int(last or first) + 1) if 1 <= n <= len(lines)]
        try:
            values = [x for line in cited for x in numbers(json.loads(line))]
        except ValueError:
            continue  # reported above
        missing = [f[0] for f in figures(label) if not in_row(f, values)]
        if missing:
            errors.append(f"{where(m.start())}: {', '.join(missing)} of [{label}] not in {name}#L{first}"
                          f"{f'-L{last}' if last else ''}")
    return errors


def test_every_cited_figure_has_its_row():
    errors = [e for doc in DOCS for e in citation_errors(doc)]
    assert not errors, "figures cite rows that do not hold them:\n" + "\n".join(errors)


def test_benchmarks_md_cites_rows_by_line():
    """The benchmarks page uses the convention: its figures link their rows, line by line."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(LINK.findall(text)) >= 20
    assert sum(1 for _, _, first, _ in LINK.findall(text) if first) >= 20


def test_a_wrong_figure_or_a_missing_row_fails(tmp_path):
    """The check can fail: a figure not in its row, a line past the end, a file that does not exist, a
    figure that cites a file but no row."""
    name = "gemm_shapes.jsonl"
    good = json.loads(rows_of(name)[0])["figures"][0]["gflops"]
    doc = tmp_path / "doc.md"
    doc.write_text(f"fine: [**{good} GFLOP/s**](../bench/results/{name}#L1), [row](bench/results/{name}#L1-L2)\n")
    assert citation_errors(doc) == []
    doc.write_text(f"wrong: [**{good + 0.3:.1f} GFLOP/s**](../bench/results/{name}#L1)\n"
                   f"past the end: [row](bench/results/{name}#L{len(rows_of(name)) + 5})\n"
                   "gone: bench/results/no_such_bench.jsonl\n"
                   f"no line: [**{good} GFLOP/s**](bench/results/{name})\n")
    errors = citation_errors(doc)
    assert len(errors) == 4, errors
    assert "doc.md:2: gemm_shapes.jsonl has no line" in errors[0]
    assert "doc.md:3: bench/results/no_such_bench.jsonl does not exist" in errors[1]
    assert f"doc.md:1: {good + 0.3:.1f} of [**{good + 0.3:.1f} GFLOP/s**] not in gemm_shapes.jsonl#L1" in errors[2]
    assert "doc.md:4: " in errors[3] and "without a row" in errors[3]


def test_figures_match_at_their_precision_or_as_percentages():
    assert in_row(figures("44.1%")[0], [0.44109])
    assert in_row(figures("527.5 tokens/s")[0], [527.4987])
    assert in_row(figures("−3.2 points")[0], [-0.0321])
    assert in_row(figures("2,264/s")[0], [2264.4])
    assert in_row(figures("1.6e-8")[0], [1.62e-8])
    assert in_row(figures("965.1 GFLOP/s")[0], [965.09e9]) and in_row(figures("156.0 MiB")[0], [156.04 * 2**20])
    assert not in_row(figures("527.6")[0], [527.4987])
    assert [f[0] for f in figures("bf16 at 32 rows, fp32 v1.16 2.5×")] == ["32", "2.5"]


def test_rows_after_the_history_carry_their_provenance():
    missing = []
    for path in sorted(RESULTS.glob("*.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if n <= LEGACY.get(path.name, 0) or not line.strip():
                continue
            row = json.loads(line)
            lacks = [k for k in ("command", "commit", "split") if k not in row]
            lacks += [] if "machine" in row or "cpu" in row else ["machine"]
            if lacks:
                missing.append(f"{path.name}:{n} lacks {', '.join(lacks)}")
    assert not missing, ("rows written without provenance (bench/results_row.py: append_row(path, "
                         "{..., **provenance(split)})):\n" + "\n".join(missing))


@pytest.fixture(scope="module")
def results_row():
    with script_module("bench", "results_row") as m:
        yield m


def test_append_row_refuses_a_row_without_provenance(results_row, tmp_path):
    out = tmp_path / "x.jsonl"
    with pytest.raises(ValueError, match=r"^x\.jsonl: row without command, commit, split, machine; ") as e:
        results_row.append_row(out, {"figure": 1.0})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="row without split"):
        results_row.append_row(out, {"command": "python bench/x.py", "commit": "abc", "machine": {}})
    with pytest.raises(ValueError, match="split"):
        results_row.append_row(out, {"command": "c", "commit": "abc", "cpu": {}, "split": ""})
    assert not out.exists()
    results_row.append_row(out, {"figure": 1.0, **results_row.provenance("none")})
    row = json.loads(out.read_text())
    assert row["split"] == "none" and row["commit"] and row["command"].startswith("python")
    assert {"cores", "cpu", "loadavg"} <= set(row["machine"]) and "vector" in row["machine"]["cpu"]
    assert row["time"].endswith("+00:00")


def test_provenance_names_a_split_and_the_command_that_reproduces_the_row(results_row):
    with pytest.raises(ValueError, match="split 'validation'"):
        results_row.provenance("validation")
    assert results_row.provenance("dev", {"cores": 2})["machine"] == {"cores": 2}
    assert results_row.command([str(ROOT / "bench" / "x.py"), "--steps", "2", "a b"]) == \
        "python bench/x.py --steps 2 'a b'"
    assert results_row.command(["/elsewhere/y.py"]) == "python /elsewhere/y.py"


BENCH_SOURCES = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "results_row.py")
SPLIT_ARG = re.compile(r"\bprovenance\(\s*([^)\s,][^,)]*)")


def static_errors(name: str, src: str) -> list[str]:
    """A bench that calls ``append_row(`` also calls ``provenance(<split>)`` (or, as bench/pipeline.py
    and bench/external_benchmarks.py do, names ``command``, ``commit`` and ``split`` in its row
    itself); no bench appends to a file other than through append_row."""
    errors = []
    if re.search(r"open\([^)]*[\"']a[\"']", src):
        errors.append(f"{name} appends to a file itself: write rows with results_row.append_row")
    if "append_row(" in src:
        calls = SPLIT_ARG.findall(src)
        if not calls and not all(k in src for k in ('"command"', '"commit"', '"split"')):
            errors.append(f"{name} appends rows without provenance(split) (bench/results_row.py)")
        errors += [f"{name}: provenance({a}) names no split" for a in calls if a.strip() in ("None", '""', "''")]
    return errors


@pytest.mark.parametrize("path", BENCH_SOURCES, ids=lambda p: p.name)
def test_every_bench_that_appends_rows_passes_a_split(path):
    assert static_errors(path.name, path.read_text()) == []


def test_the_static_check_sees_a_bench_without_a_split():
    """The parametrized check above cannot pass vacuously."""
    assert sum("append_row(" in p.read_text() for p in BENCH_SOURCES) >= 20
    assert static_errors("ok.py", 'append_row(R, {"x": 1, **provenance("dev")})') == []
    assert static_errors("ok.py", 'append_row(R, row | provenance(args.split))') == []
    assert static_errors("bare.py", 'append_row(R, {"x": 1})') == \
        ["bare.py appends rows without provenance(split) (bench/results_row.py)"]
    assert static_errors("empty.py", "append_row(R, {**provenance()})") != []
    assert static_errors("none.py", "append_row(R, {**provenance(None)})") == ["none.py: provenance(None) names no split"]
    assert static_errors("direct.py", 'with open(RESULTS, "a") as f:\n    f.write(line)') != []
