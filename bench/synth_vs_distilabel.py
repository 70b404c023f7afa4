"""The same one-column job in ``posttrain synth`` and in distilabel: answer N seed-passage questions
with the embedded SmolLM2-135M on the CPU, one sample each, same token budget and temperature.

    python bench/synth_vs_distilabel.py --venv /tmp/synth-dlvenv      # distilabel installed there

distilabel (``TransformersLLM`` + ``TextGeneration``) runs in a subprocess of the throwaway venv,
with this venv's torch/transformers on its path (distilabel is not a dependency of posttrain).
Each side is timed from after its model has loaded. Prints ``RESULT`` and appends one row to
bench/results/synth_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_row import append_row, machine, provenance

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "synth_throughput.jsonl"

DISTILABEL = r'''
import json, sys, time
from distilabel.models.llms import TransformersLLM
from distilabel.steps.tasks import TextGeneration
prompts, model, max_new, temp, batch = json.loads(sys.argv[1])
llm = TransformersLLM(model=model, device="cpu", torch_dtype="float32",
                      generation_kwargs={"max_new_tokens": max_new, "temperature": temp, "do_sample": True})
task = TextGeneration(llm=llm, input_batch_size=batch)
task.load()
t0 = time.time()
out = []
for i in range(0, len(prompts), batch):
    for res in task.process([{"instruction": p} for p in prompts[i:i + batch]]):
        out += res
el = time.time() - t0
print("DL_RESULT " + json.dumps({"elapsed": el, "rows": len(out), "nonempty": sum(bool(r.get("generation")) for r in out)}))
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", default="/tmp/synth-dlvenv")
    p.add_argument("--rows", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-rows", type=int, default=4)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()

    from posttrain.configs.synth import SynthConfig
    from posttrain.data.curate import make_teacher
    from posttrain.data.synth import build_context, render, synthesize
    from posttrain.configs import cache_dir

    seeds = [json.loads(x) for x in (ROOT / "recipes/synth/seed_passages.jsonl").read_text().splitlines()]
    template = "In two sentences, explain this: {passage}"
    cfg = SynthConfig.model_validate({
        "rows": args.rows, "seed": 0, "max_attempts": 1,
        "columns": {"s": {"type": "seed", "path": str(ROOT / "recipes/synth/seed_passages.jsonl"),
                          "field": "passage", "order": "sequential"},
                    "answer": {"type": "model", "prompt": template.replace("{passage}", "{s}")}},
        "messages": [{"role": "user", "content": template.replace("{passage}", "{s}")},
                     {"role": "assistant", "content": "{answer}"}],
        "generation": {"model": "embedded", "temperature": 0.8, "top_p": 1.0,
                       "max_new_tokens": args.max_new_tokens, "batch_rows": args.batch_rows},
        "final": {"filters": None, "dedup": None}})
    prompts = [render(template, {"passage": seeds[i % len(seeds)]["passage"]}) for i in range(args.rows)]
    name, gen = make_teacher("embedded")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        s = synthesize(cfg, gen, Path(d) / "o.jsonl", model_name=name, progress=False, ctx=build_context(cfg))
        ours = time.time() - t0
    model_dir = str(cache_dir() / "models" / "smollm2-135m-instruct")  # the converted embedded model
    env = {**os.environ, "PYTHONPATH": site.getsitepackages()[0], "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run([f"{args.venv}/bin/python", "-c", DISTILABEL,
                        json.dumps([prompts, model_dir, args.max_new_tokens, 0.8, args.batch_rows])],
                       capture_output=True, text=True, env=env, timeout=1200)
    line = next((x for x in r.stdout.splitlines() if x.startswith("DL_RESULT ")), None)
    if line is None:
        print(r.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"distilabel run failed (rc {r.returncode})")
    dl = json.loads(line.removeprefix("DL_RESULT "))
    ours_rs, dl_rs = s["rows_processed"] / ours, dl["rows"] / dl["elapsed"]
    print(f"RESULT synth_throughput: {ours_rs:.3f} rows/s (posttrain synth) vs {dl_rs:.3f} rows/s (distilabel "
          f"TransformersLLM), {args.rows} rows, embedded SmolLM2-135M, {args.max_new_tokens} new tokens, CPU")
    if not args.no_record:
        append_row(RESULTS, {
            "bench": "synth_vs_distilabel", "model": "embedded", "rows": args.rows,
            "max_new_tokens": args.max_new_tokens, "batch_rows": args.batch_rows,
            "rows_per_s": round(ours_rs, 4), "distilabel_rows_per_s": round(dl_rs, 4),
            "distilabel_rows": dl["rows"], "distilabel_nonempty": dl["nonempty"], "elapsed_s": round(ours, 2),
            "distilabel_elapsed_s": round(dl["elapsed"], 2), "threads": os.environ.get("OMP_NUM_THREADS"),
            **provenance("none", machine(load_before, os.getloadavg()[0])),
        })
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
