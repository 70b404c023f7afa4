"""The same one-column job in ``posttrain synth`` and in NeMo Data Designer, against one local vLLM server.

    python bench/synth_vs_data_designer.py                 # 32 rows, 3 repeats, concurrency 8
    python bench/synth_vs_data_designer.py --url http://127.0.0.1:8772/v1#embedded   # a server already up

The job is bench/synth_vs_distilabel.py's, so the figures relate: answer the seed passages of
recipes/synth/seed_passages.jsonl in order ("In two sentences, explain this: {passage}"), one sample
each, temperature 0.8, top_p 1.0, at most 48 new tokens, no validators, no final filters. The model is
the embedded SmolLM2-135M-Instruct behind ``vllm serve`` from ``.venv-vllm`` (bench/synth_throughput.py's
``vllm_server``, on port 8771), started once and shared by both tools.

* posttrain synth: in this process, ``data/synth.py:synthesize`` with ``generation.model:
  http://127.0.0.1:PORT/v1#embedded`` and ``batch_rows = --concurrency`` (synth's HTTP generator keeps
  at most ``min(8, batch_rows)`` requests in flight, one chunk of ``batch_rows`` rows at a time).
* Data Designer 0.9.7: bench/data_designer_driver.py in its own venv (``--dd-venv``, made with
  ``python3 -m venv /tmp/dd-venv && /tmp/dd-venv/bin/pip install data-designer==0.9.7``), a seed-dataset
  column and one ``LLMTextColumnConfig``, ``max_parallel_requests = --concurrency``; telemetry off
  (``NEMO_TELEMETRY_ENABLED=false``) and any non-loopback connection refused by an audit hook.

Each side is timed from its generation call (synth's ``synthesize``, Data Designer's ``create``) to its
return, after the server is up and after a warm-up request; the two alternate A B B A A B over the
repeats so a drift in the machine's load falls on both. Tokens: the server's own
``vllm:generation_tokens_total`` counter read before and after each run (the same count for both
tools), and, as a check, the outputs re-tokenized with the model's tokenizer. Prints ``RESULT
synth_vs_data_designer`` and appends one row to bench/results/synth_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from results_row import append_row, machine, mean_se, provenance  # bench/results_row.py (sys.path[0] is bench/)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "synth_throughput.jsonl"
SEEDS = ROOT / "recipes/synth/seed_passages.jsonl"
TEMPLATE = "In two sentences, explain this: {passage}"  # bench/synth_vs_distilabel.py's job
DRIVER = Path(__file__).parent / "data_designer_driver.py"
COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:request_success_total")


def server_counters(base: str) -> dict[str, float]:
    """The server's token and request counters (Prometheus text at /metrics), summed over label sets."""
    return parse_counters(urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode())


def parse_counters(text: str) -> dict[str, float]:
    out = {k: 0.0 for k in COUNTERS}
    for line in text.splitlines():
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


def synth_config(args: argparse.Namespace, spec: str):
    from posttrain.configs.synth import SynthConfig

    return SynthConfig.model_validate({
        "rows": args.rows, "seed": 0, "max_attempts": 1,
        "columns": {"s": {"type": "seed", "path": str(SEEDS), "field": "passage", "order": "sequential"},
                    "answer": {"type": "model", "prompt": TEMPLATE.replace("{passage}", "{s}")}},
        "messages": [{"role": "user", "content": TEMPLATE.replace("{passage}", "{s}")},
                     {"role": "assistant", "content": "{answer}"}],
        "generation": {"model": spec, "temperature": args.temperature, "top_p": args.top_p,
                       "max_new_tokens": args.max_new_tokens, "batch_rows": args.concurrency},
        "final": {"filters": None, "dedup": None}})


def run_synth(args: argparse.Namespace, spec: str) -> dict:
    from posttrain.data.curate import make_teacher
    from posttrain.data.synth import build_context, synthesize

    cfg = synth_config(args, spec)
    name, gen = make_teacher(spec)
    ctx = build_context(cfg)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "o.jsonl"
        t0 = time.time()
        s = synthesize(cfg, gen, out, model_name=name, progress=False, ctx=ctx, log=lambda _: None)
        elapsed = time.time() - t0
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        files = sorted(p.name for p in Path(d).iterdir())
    texts = [str(r["columns"].get("answer", "")) for r in rows]
    return {"elapsed": elapsed, "rows": s["rows_processed"], "written": len(rows),
            "nonempty": sum(bool(t.strip()) for t in texts), "texts": texts, "files": files,
            "row_keys": sorted(rows[0]) if rows else []}


def run_dd(args: argparse.Namespace, spec: str) -> dict:
    url, _, model = spec.partition("#")
    with tempfile.TemporaryDirectory() as d:
        a = {"endpoint": url, "model": model, "seed_path": str(SEEDS), "prompt": TEMPLATE.replace("{passage}", "{{ passage }}"),
             "rows": args.rows, "temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_new_tokens,
             "max_parallel_requests": args.concurrency, "artifact_dir": d}
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(NEMO_TELEMETRY_ENABLED="false", HF_HUB_OFFLINE="1", DATA_DESIGNER_HOME=str(Path(d) / "home"),
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        r = subprocess.run([f"{args.dd_venv}/bin/python", str(DRIVER), json.dumps(a)], capture_output=True,
                           text=True, env=env, timeout=1800, cwd=d)
    line = next((x for x in r.stdout.splitlines() if x.startswith("DD_RESULT ")), None)
    if line is None:
        print((r.stdout + r.stderr)[-4000:], file=sys.stderr)
        raise SystemExit(f"Data Designer run failed (rc {r.returncode})")
    res = json.loads(line.removeprefix("DD_RESULT "))
    res["written"] = res["rows"]
    gen = re.search(r"Async generation complete \[([0-9.]+)s\]", r.stderr + r.stdout)  # its own log: generation alone
    res["generation_s"] = float(gen.group(1)) if gen else None
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=8,
                   help="synth's batch_rows and Data Designer's max_parallel_requests (synth caps in-flight requests at 8)")
    p.add_argument("--port", type=int, default=8771)
    p.add_argument("--url", help="use this running server (http://host:port/v1#model) instead of starting one")
    p.add_argument("--dd-venv", default="/tmp/dd-venv")
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--wait-s", type=int, default=1500, help="how long to wait for vllm serve to come up (loaded CPU: minutes)")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()
    if not Path(f"{args.dd_venv}/bin/python").exists():
        raise SystemExit(f"no {args.dd_venv}/bin/python: python3 -m venv {args.dd_venv} && "
                         f"{args.dd_venv}/bin/pip install data-designer==0.9.7")
    from posttrain.models.loading import resolve_spec

    model_dir = str(resolve_spec("embedded"))
    if args.url:
        bench(args, args.url, model_dir)
        return
    from synth_throughput import vllm_server

    with vllm_server(args.vllm_python, model_dir, port=args.port, wait_s=args.wait_s) as spec:
        bench(args, spec, model_dir)


def bench(args: argparse.Namespace, spec: str, model_dir: str) -> None:
    from posttrain.engines.openai_compat import OpenAIGenerator
    from posttrain.engines.base import SamplingParams

    base = spec.partition("#")[0].removesuffix("/v1")
    warm = OpenAIGenerator.from_spec(spec)  # warm-up: neither tool pays for the server's first requests
    warm.generate([[{"role": "user", "content": "Say hello."}]] * args.concurrency,
                  SamplingParams(max_new_tokens=8, temperature=0.8))
    runs: list[dict] = []
    order = [("synth", "dd") if i % 2 == 0 else ("dd", "synth") for i in range(args.repeats)]  # A B, B A, A B
    load_first = os.getloadavg()[0]
    for i, pair in enumerate(order):
        for tool in pair:
            before, load0 = server_counters(base), os.getloadavg()[0]
            res = run_synth(args, spec) if tool == "synth" else run_dd(args, spec)
            after, load1 = server_counters(base), os.getloadavg()[0]
            delta = {k.removeprefix("vllm:").removesuffix("_total"): after[k] - before[k] for k in COUNTERS}
            res.update(tool=tool, repeat=i, load_before=load0, load_after=load1, server=delta,
                       rows_per_s=res["rows"] / res["elapsed"], tok_per_s=delta["generation_tokens"] / res["elapsed"])
            runs.append(res)
            print(f"[{tool:5s} repeat {i}] {res['rows']} rows in {res['elapsed']:.1f} s: {res['rows_per_s']:.3f} rows/s, "
                  f"{delta['generation_tokens']:.0f} completion tokens ({res['tok_per_s']:.1f}/s), "
                  f"{delta['prompt_tokens']:.0f} prompt tokens, {delta['request_success']:.0f} requests; "
                  f"load {load0:.2f} → {load1:.2f}", flush=True)
            if res.get("generation_s") is not None:
                print(f"  Data Designer's own log: generation {res['generation_s']:.1f} s of the {res['elapsed']:.1f} s "
                      f"(the rest: health probe, parquet, profiler)", flush=True)
            if res.get("blocked"):
                print(f"  Data Designer tried to leave the machine (refused): {res['blocked']}", flush=True)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for r in runs:
        r["output_tokens"] = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in r["texts"])
    by = {t: [r for r in runs if r["tool"] == t] for t in ("synth", "dd")}
    stat = {t: {k: mean_se([r[k] for r in rs]) for k in ("rows_per_s", "tok_per_s")} for t, rs in by.items()}
    ratios = [s["rows_per_s"] / d["rows_per_s"] for s, d in zip(by["synth"], by["dd"])]
    tok_ratios = [s["tok_per_s"] / d["tok_per_s"] for s, d in zip(by["synth"], by["dd"])]
    ratio, ratio_se = mean_se(ratios)
    tok_ratio, tok_ratio_se = mean_se(tok_ratios)
    for t, label in (("synth", "posttrain synth"), ("dd", "Data Designer 0.9.7")):
        print(f"{label:20s} {stat[t]['rows_per_s'][0]:.3f} ± {stat[t]['rows_per_s'][1]:.3f} rows/s, "
              f"{stat[t]['tok_per_s'][0]:.1f} ± {stat[t]['tok_per_s'][1]:.1f} completion tokens/s "
              f"(server count; re-tokenized outputs: {statistics.fmean(r['output_tokens'] for r in by[t]):.0f} a run)")
    print(f"completion tokens/s ratio {tok_ratio:.2f} ± {tok_ratio_se:.2f}×; per-repeat rows/s ratios "
          + ", ".join(f"{x:.2f}" for x in ratios))
    dd0 = by["dd"][0]
    print(f"Data Designer wrote: {', '.join(dd0['files'])}; columns {dd0['columns']}")
    print(f"posttrain synth wrote: {', '.join(by['synth'][0]['files'])}; row keys {by['synth'][0]['row_keys']}")
    if not args.no_record:
        append_row(RESULTS, {
            "bench": "synth_vs_data_designer", "model": "embedded", "engine": "vllm-serve", "rows": args.rows,
            "repeats": args.repeats, "order": [t for pair in order for t in pair], "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "concurrency": args.concurrency,
            "data_designer": "0.9.7",
            "rows_per_s": round(stat["synth"]["rows_per_s"][0], 4), "rows_per_s_se": round(stat["synth"]["rows_per_s"][1], 4),
            "tok_per_s": round(stat["synth"]["tok_per_s"][0], 2), "tok_per_s_se": round(stat["synth"]["tok_per_s"][1], 2),
            "dd_rows_per_s": round(stat["dd"]["rows_per_s"][0], 4), "dd_rows_per_s_se": round(stat["dd"]["rows_per_s"][1], 4),
            "dd_tok_per_s": round(stat["dd"]["tok_per_s"][0], 2), "dd_tok_per_s_se": round(stat["dd"]["tok_per_s"][1], 2),
            "ratio_rows_per_s": round(ratio, 3), "ratio_rows_per_s_se": round(ratio_se, 3),
            "ratio_tok_per_s": round(tok_ratio, 3), "ratio_tok_per_s_se": round(tok_ratio_se, 3),
            "runs": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                      if k not in ("texts", "files", "columns", "row_keys")} for r in runs],
            "dd_files": dd0["files"], "dd_columns": dd0["columns"],
            "dd_blocked_connections": sorted({b for r in by["dd"] for b in r.get("blocked", [])}),
            "threads": os.environ.get("OMP_NUM_THREADS"),
            **provenance("none", machine(load_first, os.getloadavg()[0])),
        })
        print(f"appended to {RESULTS}")
    print(f"RESULT synth_vs_data_designer: {ratio:.2f} ± {ratio_se:.2f}× rows/s (posttrain synth vs Data Designer "
          f"0.9.7, same vLLM server, {args.rows} rows, {args.repeats} repeats, mean ± se)")


if __name__ == "__main__":
    main()
