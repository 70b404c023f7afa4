"""Behaviour profile of an SFT dataset: what habits would a model trained on it pick up?

    posttrain profile-data data/sft.jsonl [--tokenizer embedded] [--out data/sft_profile]

The recipe (docs/recipe.md §1) profiles data before training because the data's habits become the
model's: too many long trajectories teach over-searching, and if nearly every sample that offers a
tool also calls one, "always call a tool when one is offered" is learned as a bias. Reported:

* length distributions (tokens with ``--tokenizer``, else words): the assistant output of a
  trajectory, its reasoning, each assistant turn, the whole conversation; turns per trajectory;
* tool calls per trajectory, and the share of trajectories with at least ``--many-calls`` calls;
* tool diversity: distinct tools called, usage counts, entropy of the usage distribution in bits and
  normalised by log2(distinct tools) (1 = all tools used equally);
* a tool co-occurrence matrix: cell (a, b) = trajectories that call both a and b (diagonal: those
  that call a);
* tool use when offered: the share of samples with tool definitions that call at least one tool
  (and, as a check, calls in samples offering none);
* warnings when the two habits above cross a threshold.

Outputs: a printed table, ``profile.json``, and (matplotlib, Agg backend) ``lengths.png`` (four
histograms) and ``tool_cooccurrence.png`` (heatmap) in the output directory. The statistics are pure
functions of the rows (``profile_rows``) so they are tested without files or plots.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

Row = dict[str, Any]
CountFn = Callable[[str], int]

WORDS = "words"
TOKENS = "tokens"


@dataclass
class RowStats:
    assistant_len: int
    reasoning_len: int
    total_len: int
    turn_lens: list[int]
    tool_calls: list[str]  # names, in call order
    tools_offered: list[str]
    malformed_calls: int = 0
    domain: str = "unknown"
    n_messages: int = 0

    @property
    def turns(self) -> int:
        return len(self.turn_lens)


def row_stats(row: Row, count: CountFn) -> RowStats:
    """Lengths and tool use of one conversation row."""
    from posttrain.data.sft_filters import reasoning_and_answer, tool_calls_of, tool_name
    from posttrain.models.chat_template import ToolCallParseError, assistant_text

    turn_lens: list[int] = []
    reasoning_len = total_len = 0
    calls: list[str] = []
    malformed = 0
    messages = row.get("messages") or []
    for m in messages:
        if m.get("role") == "assistant":
            try:
                text = assistant_text(m)
                calls += [name for name, _ in tool_calls_of(m)]
            except (ToolCallParseError, AttributeError, TypeError):
                text = str(m.get("content") or "")
                malformed += 1
            n = count(text)
            turn_lens.append(n)
            reasoning, _ = reasoning_and_answer(m)
            reasoning_len += count(reasoning) if reasoning else 0
        else:
            n = count(str(m.get("content") or ""))
        total_len += n
    offered = [n for n in (tool_name(t) for t in row.get("tools") or [] if isinstance(t, dict)) if n]
    return RowStats(sum(turn_lens), reasoning_len, total_len, turn_lens, calls, offered, malformed,
                    str(row.get("domain") or "unknown"), len(messages))


def distribution(values: Sequence[float]) -> dict[str, float]:
    """count, mean, min, p50, p90, p99, max (nearest-rank percentiles)."""
    if not values:
        return {"count": 0}
    v = sorted(values)

    def pct(q: float) -> float:
        return float(v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))])

    return {"count": len(v), "mean": round(sum(v) / len(v), 3), "min": float(v[0]), "p50": pct(0.5),
            "p90": pct(0.9), "p99": pct(0.99), "max": float(v[-1])}


def entropy_bits(counts: Iterable[int]) -> float:
    c = [x for x in counts if x > 0]
    total = sum(c)
    return -sum(x / total * math.log2(x / total) for x in c) if total else 0.0


@dataclass
class Thresholds:
    many_calls: int = 10  # a trajectory with at least this many calls counts as long
    long_share_warn: float = 0.2  # warn when more than this share of tool trajectories is long
    always_call_warn: float = 0.95  # warn when at least this share of tool-offering samples calls a tool
    min_rows_for_warning: int = 20


def profile_rows(rows: Iterable[Row], count: CountFn, unit: str = WORDS,
                 thresholds: Thresholds | None = None) -> dict[str, Any]:
    """The whole profile as a JSON-able dict (see the module docstring)."""
    return profile_stats([row_stats(r, count) for r in rows], unit, thresholds)


def profile_stats(stats: Sequence[RowStats], unit: str = WORDS, thresholds: Thresholds | None = None) -> dict[str, Any]:
    th = thresholds or Thresholds()
    usage: Counter[str] = Counter()
    pair: Counter[tuple[str, str]] = Counter()
    domains: Counter[str] = Counter()
    for s in stats:
        usage.update(s.tool_calls)
        domains[s.domain] += 1
        called = sorted(set(s.tool_calls))
        for i, a in enumerate(called):
            for b in called[i:]:
                pair[a, b] += 1
    tools = sorted(usage, key=lambda t: (-usage[t], t))
    matrix = [[pair[min(a, b), max(a, b)] for b in tools] for a in tools]
    offered = [s for s in stats if s.tools_offered]
    not_offered = [s for s in stats if not s.tools_offered]
    with_calls = [s for s in stats if s.tool_calls]
    use_rate = sum(bool(s.tool_calls) for s in offered) / len(offered) if offered else None
    long_share = (sum(len(s.tool_calls) >= th.many_calls for s in with_calls) / len(with_calls)) if with_calls else 0.0
    h = entropy_bits(usage.values())
    profile: dict[str, Any] = {
        "rows": len(stats),
        "unit": unit,
        "lengths": {
            "assistant_output": distribution([s.assistant_len for s in stats]),
            "reasoning": distribution([s.reasoning_len for s in stats]),
            "assistant_turn": distribution([n for s in stats for n in s.turn_lens]),
            "conversation": distribution([s.total_len for s in stats]),
        },
        "turns": {
            "assistant_turns": distribution([s.turns for s in stats]),
            "messages": distribution([s.n_messages for s in stats]),
        },
        "reasoning_share": round(sum(s.reasoning_len > 0 for s in stats) / len(stats), 4) if stats else 0.0,
        "tool_calls": {
            "per_trajectory": distribution([len(s.tool_calls) for s in stats]),
            "per_trajectory_with_calls": distribution([len(s.tool_calls) for s in with_calls]),
            "total": sum(usage.values()),
            "malformed_turns": sum(s.malformed_calls for s in stats),
            "many_calls_threshold": th.many_calls,
            "share_with_many_calls": round(long_share, 4),
        },
        "tool_diversity": {
            "distinct_tools_called": len(tools),
            "distinct_tools_offered": len({t for s in stats for t in s.tools_offered}),
            "usage": {t: usage[t] for t in tools},
            "entropy_bits": round(h, 4),
            "normalized_entropy": round(h / math.log2(len(tools)), 4) if len(tools) > 1 else None,
            "distinct_per_trajectory": distribution([len(set(s.tool_calls)) for s in with_calls]),
        },
        "cooccurrence": {"tools": tools, "matrix": matrix},
        "tool_use_when_offered": {
            "rows_offering_tools": len(offered),
            "rate": None if use_rate is None else round(use_rate, 4),
            "rows_without_tools_that_call": sum(bool(s.tool_calls) for s in not_offered),
        },
        "domains": dict(domains.most_common()),
    }
    profile["warnings"] = warnings_for(profile, th)
    return profile


def warnings_for(profile: dict[str, Any], th: Thresholds) -> list[str]:
    out = []
    use = profile["tool_use_when_offered"]
    if use["rate"] is not None and use["rows_offering_tools"] >= th.min_rows_for_warning and use["rate"] >= th.always_call_warn:
        out.append(f"{use['rate']:.0%} of the samples that offer tools call one: a model trained on this learns to "
                   "always call a tool when offered; add samples that answer directly")
    tc = profile["tool_calls"]
    if tc["per_trajectory_with_calls"]["count"] >= th.min_rows_for_warning and tc["share_with_many_calls"] > th.long_share_warn:
        out.append(f"{tc['share_with_many_calls']:.0%} of the tool trajectories make >= {th.many_calls} calls: "
                   "too many long trajectories teach over-searching")
    if use["rows_without_tools_that_call"]:
        out.append(f"{use['rows_without_tools_that_call']} samples call tools without tool definitions (malformed)")
    return out


# --------------------------------------------------------------------------- report


def format_table(p: dict[str, Any]) -> str:
    unit = p["unit"]
    lines = [f"{p['rows']} samples; lengths in {unit}", "",
             f"{'':<32}{'mean':>9}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}"]
    series = [(f"assistant output ({unit})", p["lengths"]["assistant_output"]),
              (f"reasoning ({unit})", p["lengths"]["reasoning"]),
              (f"assistant turn ({unit})", p["lengths"]["assistant_turn"]),
              (f"conversation ({unit})", p["lengths"]["conversation"]),
              ("assistant turns", p["turns"]["assistant_turns"]),
              ("tool calls / trajectory", p["tool_calls"]["per_trajectory"])]
    for name, d in series:
        if d.get("count"):
            lines.append(f"{name:<32}{d['mean']:>9.1f}{d['p50']:>8.0f}{d['p90']:>8.0f}{d['p99']:>8.0f}{d['max']:>8.0f}")
    div, use = p["tool_diversity"], p["tool_use_when_offered"]
    lines += ["", f"samples with reasoning: {p['reasoning_share']:.1%}",
              f"tool calls: {p['tool_calls']['total']}; distinct tools called {div['distinct_tools_called']} "
              f"of {div['distinct_tools_offered']} offered; usage entropy {div['entropy_bits']:.2f} bits"
              + (f" (normalised {div['normalized_entropy']:.2f})" if div["normalized_entropy"] is not None else ""),
              "tool use when offered: " + ("n/a (no sample offers tools)" if use["rate"] is None else
                                           f"{use['rate']:.1%} of {use['rows_offering_tools']} samples"),
              f"trajectories with >= {p['tool_calls']['many_calls_threshold']} calls: "
              f"{p['tool_calls']['share_with_many_calls']:.1%} of those with calls"]
    if div["usage"]:
        lines.append("most used tools: " + ", ".join(f"{t} {n}" for t, n in list(div["usage"].items())[:8]))
    if len(p["domains"]) > 1:
        lines.append("domains: " + ", ".join(f"{d} {n}" for d, n in p["domains"].items()))
    lines += [f"WARNING: {w}" for w in p["warnings"]]
    return "\n".join(lines)


def plot(p: dict[str, Any], stats_values: dict[str, list[int]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (title, values) in zip(axes.flat, stats_values.items()):
        lo, hi = min(values), max(values)
        # counts with a small range get one bar per value; lengths get 40 bins
        bins: Any = [x - 0.5 for x in range(lo, hi + 2)] if hi - lo <= 40 else 40
        ax.hist(values, bins=bins, color="#4C72B0")
        ax.set_title(title)
        ax.set_ylabel("samples")
    fig.tight_layout()
    path = out_dir / "lengths.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    tools, matrix = p["cooccurrence"]["tools"], p["cooccurrence"]["matrix"]
    if tools:
        size = max(4.0, 0.45 * len(tools) + 2)
        fig, ax = plt.subplots(figsize=(size + 1, size))
        im = ax.imshow(matrix, cmap="viridis")
        ax.set_xticks(range(len(tools)), tools, rotation=90, fontsize=8)
        ax.set_yticks(range(len(tools)), tools, fontsize=8)
        if len(tools) <= 15:
            top = max(max(r) for r in matrix) or 1
            for i, row in enumerate(matrix):
                for j, v in enumerate(row):
                    ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                            color="white" if v < top / 2 else "black")
        ax.set_title("trajectories calling both tools")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        path = out_dir / "tool_cooccurrence.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def counter_for(tokenizer_spec: str | None) -> tuple[CountFn, str]:
    if not tokenizer_spec:
        return (lambda text: len(text.split())), WORDS
    from posttrain.models.loading import load_tokenizer

    tok = load_tokenizer(tokenizer_spec)
    return (lambda text: len(tok.encode(text, add_special_tokens=False)) if text else 0), TOKENS


# --------------------------------------------------------------------------- synthetic sets


def minhash_clusters(texts: Sequence[str], threshold: float = 0.5, num_perm: int = 128) -> list[int]:
    """Greedy near-duplicate clusters: each text joins the first earlier cluster head whose MinHash
    Jaccard estimate reaches ``threshold``, else starts a cluster. Returns a cluster id per text."""
    from posttrain.data.dedup import MinHasher, NearDupIndex

    if not texts:
        return []
    hasher = MinHasher(num_perm=num_perm)
    index = NearDupIndex(hasher, threshold)
    ids: list[int] = []
    for i, sig in enumerate(hasher.signatures(list(texts))):
        head = index.find(sig)
        if head is None:
            index.add(i, sig)
            ids.append(i)
        else:
            ids.append(ids[int(head)])  # type: ignore[arg-type]
    return ids


def synth_profile(rows: Sequence[Row], summary: dict[str, Any] | None, topic_column: str | None,
                  threshold: float = 0.5) -> dict[str, Any]:
    """What a ``posttrain synth`` set adds to the profile: acceptance by validator (from the run's
    summary: failed attempts per ``<column>:<reason>``), diversity as MinHash clusters of the
    assistant turns, and coverage of a topic column (its values in the rows; the config's
    category values when the summary has them)."""
    texts = ["\n".join(str(m.get("content") or "") for m in r.get("messages", []) if m.get("role") == "assistant")
             for r in rows]
    clusters = Counter(minhash_clusters(texts, threshold))
    out: dict[str, Any] = {"diversity": {
        "threshold": threshold, "clusters": len(clusters),
        "cluster_share": round(len(clusters) / len(rows), 4) if rows else None,
        "largest_cluster": max(clusters.values(), default=0),
    }}
    if summary is not None:
        counts = summary.get("total") or summary  # a resumed run: the counts over every run into the file
        by_col: Counter[str] = Counter()
        for key, n in (counts.get("failures") or {}).items():
            by_col[key.split(":", 1)[0]] += n
        processed = counts.get("rows_processed") or 0
        out["acceptance"] = {
            "rows_processed": processed, "accepted": counts.get("accepted"),
            "rate": round(counts["accepted"] / processed, 4) if processed else None,
            "failed_attempts_by_validator": dict(by_col.most_common()),
            "failure_reasons": counts.get("failures") or {},
            "final_dropped": counts.get("final_dropped") or {},
        }
    if topic_column:
        seen = Counter(str((r.get("columns") or {}).get(topic_column)) for r in rows)
        col = (((summary or {}).get("config") or {}).get("columns") or {}).get(topic_column) or {}
        values = [str(v) for v in col.get("values", [])] if col.get("type") == "category" else None
        out["topic_coverage"] = {
            "column": topic_column, "counts": dict(seen.most_common()), "distinct": len(seen),
            "of_values": len(values) if values else None,
            "missing": sorted(set(values) - set(seen)) if values else None,
            "entropy_bits": round(entropy_bits(seen.values()), 4),
        }
    return out


def plot_synth(sp: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in (("acceptance", "failed attempts by validator"), ("topic_coverage", "rows per topic"))
              if k in sp]
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        data = sp[key]["failed_attempts_by_validator"] if key == "acceptance" else sp[key]["counts"]
        ax.barh(list(data)[:30], list(data.values())[:30], color="#4C72B0")
        ax.set_title(title)
        ax.invert_yaxis()
    fig.tight_layout()
    path = out_dir / "synth.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
