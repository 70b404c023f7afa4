"""Curation throughput: candidates/s through the filter stack and through MinHash/LSH dedup.

    python bench/curation_throughput.py                    # 10k and 100k candidates
    python bench/curation_throughput.py --sizes 2000       # quick look

Generation is excluded: candidates are synthesized. Each prompt gets N candidates written from
sentence templates over a Zipf-distributed generated vocabulary (so word frequencies look like
text), with reasoning in a think block, 60-400 words, and the cases curation exists for mixed in:
near-copies of a sibling candidate (a few words edited), copies of another prompt's sample,
generation loops, a paragraph restated, malformed and valid tool calls, a blocked narrative, and
length-truncated generations.

Measured:
* the filter stack (all default filters) in one process and in ``--workers`` processes;
* dedup (``Deduper``: per-prompt near-dups, global LSH, ≤K by diversity), with the MinHash
  signature time reported separately — targets: ≥1,000 candidates/s for the filters on 2 cores,
  dedup time growing about linearly from 10k to 100k;
* the vectorised MinHash against ``datasketch.MinHash.bulk`` (SHA-1 per shingle) on a sample.

Prints a table and appends one JSON line to bench/results/curation_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import platform
import random
import time
from pathlib import Path

from posttrain.data.dedup import Deduper, MinHasher, words_of
from posttrain.data.sft_filters import FilterStack
from posttrain.models.chat_template import format_tool_call
from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).parent / "results" / "curation_throughput.jsonl"
SYLLABLES = ["ka", "lo", "mi", "ren", "sta", "vo", "qui", "del", "an", "tor", "ex", "pul", "zi", "mar", "on",
             "bel", "gra", "sim", "ut", "fen"]
TEMPLATES = [
    "First we {v} the {n} and {v} it with the {n}.",
    "The {n} of {n} is {num}, so the {n} must be {num}.",
    "Then {v} every {n} in the {n} until the {n} is {a}.",
    "This {v} because a {a} {n} cannot {v} a {n}.",
    "We can check that {num} plus {num} gives {num}, which matches the {n}.",
    "A {a} approach would {v} the {n} directly.",
    "So the answer depends on whether the {n} is {a} or {a}.",
    "Note that each {n} has {num} {n} and {num} {n}.",
]
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
    for n in ("search", "lookup", "calculator")]


class Synth:
    def __init__(self, seed: int, vocab_size: int = 20000) -> None:
        self.rng = random.Random(seed)
        words = set()
        while len(words) < vocab_size:
            words.add("".join(self.rng.choice(SYLLABLES) for _ in range(self.rng.randint(2, 4))))
        self.vocab = sorted(words)
        # Zipf weights: a few words are frequent, most are rare, as in text
        cum, total = [], 0.0
        for r in range(1, vocab_size + 1):
            total += 1.0 / r
            cum.append(total)
        self.cum = cum

    def word(self) -> str:
        return self.rng.choices(self.vocab, cum_weights=self.cum)[0]

    def sentence(self) -> str:
        t = self.rng.choice(TEMPLATES)
        return t.format_map(_Slots(self))

    def paragraph(self, n_words: int) -> str:
        out, count = [], 0
        while count < n_words:
            s = self.sentence()
            out.append(s)
            count += len(s.split())
        return " ".join(out)

    def edit(self, text: str, n: int) -> str:
        w = text.split()
        for _ in range(n):
            w[self.rng.randrange(len(w))] = self.word()
        return " ".join(w)


class _Slots(dict):
    def __init__(self, synth: Synth) -> None:
        super().__init__()
        self.s = synth

    def __missing__(self, key: str) -> str:
        if key == "num":
            return str(self.s.rng.randint(0, 999))
        return self.s.word()


def synthesize(n_candidates: int, per_prompt: int = 8, seed: int = 0) -> list[dict]:
    s = Synth(seed)
    rng = s.rng
    rows: list[dict] = []
    prompt_id = 0
    while len(rows) < n_candidates:
        prompt = f"Question {prompt_id}: " + s.paragraph(rng.randint(15, 60))
        tools = TOOLS if rng.random() < 0.2 else None
        siblings: list[str] = []
        for j in range(per_prompt):
            u = rng.random()
            if siblings and u < 0.25:  # near-copy of a sibling
                body = s.edit(rng.choice(siblings), rng.randint(1, 4))
            elif rows and u < 0.27:  # another prompt's sample, copied
                other = rng.choice(rows)
                prompt_text, body = other["messages"][0]["content"], other["messages"][1]["content"]
                rows.append(_row(f"p{prompt_id}", prompt_text, body, other.get("tools")))
                continue
            else:
                reasoning = s.paragraph(rng.randint(40, 300))
                answer = s.paragraph(rng.randint(10, 80))
                if u < 0.30:
                    reasoning += " Let me recheck the last step once more." * rng.randint(6, 12)  # a loop
                elif u < 0.32:
                    reasoning = "\n\n".join([reasoning] * 3)  # restated
                elif u < 0.34:
                    answer += " Our nation is strong because our values are eternal."
                body = f"<think>\n{reasoning}\n</think>\n{answer}"
                if tools and u > 0.6:
                    body += "\n" + format_tool_call(rng.choice(["search", "lookup"]), {"q": s.word()})
                elif u > 0.985:
                    body += "\n<tool_call>\n<function=search>\n<parameter=q>\nx\n</function>"  # unclosed
            siblings.append(body)
            finish = "length" if rng.random() < 0.02 else "stop"
            rows.append(_row(f"p{prompt_id}", prompt, body, tools, finish))
        prompt_id += 1
    return rows[:n_candidates]


def _row(pid: str, prompt: str, body: str, tools, finish: str = "stop") -> dict:
    row = {"prompt_id": pid, "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": body}],
           "provenance": {"finish_reason": finish, "prompt_messages": 1}}
    if tools:
        row["tools"] = tools
    return row


# --------------------------------------------------------------------------- measurements


def _filter_chunk(rows: list[dict]) -> dict:
    stack = FilterStack.from_config()
    stack.apply(rows)
    return dict(stack.dropped)


def bench_filters(rows: list[dict], workers: int) -> dict:
    t, c = time.perf_counter(), time.process_time()
    stack = FilterStack.from_config()
    stack.apply(rows)
    one, one_cpu = time.perf_counter() - t, time.process_time() - c
    chunks = [rows[i::workers] for i in range(workers)]
    t = time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_filter_chunk, chunks)
    many = time.perf_counter() - t
    return {"one_process_s": round(one, 3), "one_process_per_s": round(len(rows) / one),
            "one_process_cpu_s": round(one_cpu, 3), "one_process_per_cpu_s": round(len(rows) / one_cpu),
            f"{workers}_processes_s": round(many, 3), f"{workers}_processes_per_s": round(len(rows) / many),
            "kept": stack.kept, "dropped": dict(stack.dropped.most_common())}


def bench_dedup(rows: list[dict], k: int) -> dict:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["prompt_id"], []).append(r)
    dd = Deduper()
    c = time.process_time()
    dd.hasher.signatures([r["messages"][1]["content"] for r in rows])
    sig_cpu = time.process_time() - c
    dd = Deduper()  # fresh: the timed run below includes signatures again, as curation does
    dropped: dict[str, int] = {}
    kept = 0
    t, c = time.perf_counter(), time.process_time()
    for pid, g in groups.items():
        sel = dd.select([f"{pid}#{i}" for i in range(len(g))], g[0]["messages"][0]["content"],
                        [r["messages"][1]["content"] for r in g], list(range(len(g))), k)
        kept += len(sel.kept)
        for reason in sel.dropped.values():
            dropped[reason] = dropped.get(reason, 0) + 1
    total, cpu = time.perf_counter() - t, time.process_time() - c
    return {"total_s": round(total, 3), "per_s": round(len(rows) / total), "cpu_s": round(cpu, 3),
            "per_cpu_s": round(len(rows) / cpu), "signatures_cpu_s": round(sig_cpu, 3),
            "signatures_per_cpu_s": round(len(rows) / sig_cpu), "kept": kept, "dropped": dropped}


def bench_minhash_backends(rows: list[dict], n: int = 2000) -> dict:
    from datasketch import MinHash

    texts = [r["messages"][1]["content"] for r in rows[:n]]
    t = time.perf_counter()
    MinHasher().signatures(texts)
    ours = time.perf_counter() - t
    t = time.perf_counter()
    shingled = []
    for text in texts:
        w = words_of(text)
        shingled.append([b" ".join(w[i:i + 3]) for i in range(max(1, len(w) - 2))])
    MinHash.bulk(shingled, num_perm=128)
    theirs = time.perf_counter() - t
    return {"texts": len(texts), "numpy_per_s": round(len(texts) / ours), "datasketch_bulk_per_s": round(len(texts) / theirs),
            "speedup": round(theirs / ours, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--per-prompt", type=int, default=8)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    results: dict = {"sizes": {}}
    for n in args.sizes:
        t = time.perf_counter()
        rows = synthesize(n, args.per_prompt, seed=n)
        words = sum(len(r["messages"][1]["content"].split()) for r in rows) / len(rows)
        print(f"synthesized {n} candidates ({n // args.per_prompt} prompts, {words:.0f} words each on average) "
              f"in {time.perf_counter() - t:.1f}s", flush=True)
        results["sizes"][n] = {"mean_words": round(words), "filters": bench_filters(rows, args.workers),
                               "dedup": bench_dedup(rows, args.k)}
        if n == args.sizes[0]:
            results["minhash_backends"] = bench_minhash_backends(rows)
    sizes = sorted(results["sizes"])
    if len(sizes) > 1:
        # CPU time, not wall time: on a shared machine other jobs' load swings wall time by 2x
        a, b = results["sizes"][sizes[0]]["dedup"]["cpu_s"], results["sizes"][sizes[-1]]["dedup"]["cpu_s"]
        results["dedup_cpu_time_ratio"] = round(b / a, 2)
        results["dedup_size_ratio"] = sizes[-1] / sizes[0]

    w = args.workers
    print(f"\n{'candidates':>10} {'words':>6} {'filters 1p/s':>13} {'(per cpu-s)':>12} {f'filters {w}p/s':>13} "
          f"{'dedup/s':>8} {'(per cpu-s)':>12} {'dedup cpu-s':>12} {'minhash/cpu-s':>14}")
    for n in sizes:
        r = results["sizes"][n]
        f, d = r["filters"], r["dedup"]
        print(f"{n:>10} {r['mean_words']:>6} {f['one_process_per_s']:>13} {f['one_process_per_cpu_s']:>12} "
              f"{f[f'{w}_processes_per_s']:>13} {d['per_s']:>8} {d['per_cpu_s']:>12} {d['cpu_s']:>12.1f} "
              f"{d['signatures_per_cpu_s']:>14}")
    if "dedup_cpu_time_ratio" in results:
        ratio, size = results["dedup_cpu_time_ratio"], results["dedup_size_ratio"]
        print(f"dedup CPU time x{ratio} for x{size:.0f} candidates (linear: x{size:.0f}; "
              f"exponent {math.log(ratio) / math.log(size):.2f})")
    mb = results["minhash_backends"]
    print(f"MinHash on {mb['texts']} texts: numpy {mb['numpy_per_s']}/s vs datasketch MinHash.bulk "
          f"{mb['datasketch_bulk_per_s']}/s (x{mb['speedup']})")
    last = results["sizes"][sizes[-1]]
    print(f"drops at {sizes[-1]}: filters {last['filters']['dropped']}; dedup {last['dedup']['dropped']}")

    if not args.no_save:
        record = {"bench": "curation_throughput", "python": platform.python_version(), "workers": w, "k": args.k,
                  **results, **provenance("none")}  # synthesized candidates, timed: nothing graded
        append_row(RESULTS, record)
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
