"""(d) of issue 14: an exported FP8 checkpoint loads in transformers (through compressed-tensors)
and gives the same greedy outputs as posttrain's in-process FP8 simulation.

    /tmp/venv-fp8/bin/python bench/quant_transformers_check.py EXPORT_DIR [...] [--no-save]

For each export: greedy-decode 32 tokens for each prompt with (1) transformers'
``AutoModelForCausalLM.from_pretrained`` and (2) ``posttrain.quant.checkpoint.load_fp8``, with
the same chat rendering; print per prompt whether the token ids are identical, and the largest
logit difference on the prompt. With an FP8 KV cache in the export, (2) is also run without its
KV simulation, since transformers does not apply the KV scales (vLLM does). Appends one row to
bench/results/quant_transformers_check.jsonl (``--no-save``: none).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["What is 17 + 25?", "Name the capital of France.", "Write a haiku about rain.",
           "What is 123 * 4? Answer with the number.", "List three prime numbers."]


def greedy(model, ids, n=32):
    out = model.generate(ids, max_new_tokens=n, do_sample=False, use_cache=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def main() -> int:
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from posttrain.models.chat_template import render
    from posttrain.models.loading import load_tokenizer
    from posttrain.quant.checkpoint import load_fp8
    from posttrain.quant.simulate import set_kv_enabled

    logging.set_verbosity_error()
    paths = [a for a in sys.argv[1:] if a != "--no-save"]
    results = {}
    for path in paths:
        t = time.perf_counter()
        theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        t_load = time.perf_counter() - t
        ours = load_fp8(path)
        has_kv = set_kv_enabled(ours, True)
        tok = load_tokenizer(path)
        same = same_nokv = 0
        maxdiff = 0.0
        for p in PROMPTS:
            ids = torch.tensor([render(tok, [{"role": "user", "content": p}], None, add_generation_prompt=True).input_ids])
            with torch.no_grad():
                a = greedy(theirs, ids)
                b = greedy(ours, ids)
                maxdiff = max(maxdiff, (theirs(ids).logits - ours(ids).logits).abs().max().item())
            same += a == b
            if has_kv:
                set_kv_enabled(ours, False)
                with torch.no_grad():
                    same_nokv += greedy(ours, ids) == a
                set_kv_enabled(ours, True)
        line = (f"{path}: transformers load {t_load:.1f}s; identical greedy outputs {same}/{len(PROMPTS)}; "
                f"max |logit diff| on the prompts {maxdiff:.2e}")
        if has_kv:
            line += f"; without posttrain's KV-cache simulation: identical {same_nokv}/{len(PROMPTS)}"
        print(line, flush=True)
        results[path] = {"load_s": round(t_load, 1), "identical": same, "prompts": len(PROMPTS),
                         "max_logit_diff": maxdiff, **({"identical_without_kv": same_nokv} if has_kv else {})}
    if "--no-save" not in sys.argv[1:]:
        import transformers
        from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

        append_row(Path(__file__).resolve().parent / "results" / "quant_transformers_check.jsonl", {
            "bench": "quant_transformers_check", "transformers": transformers.__version__, "exports": results,
            **provenance("none")})  # five made-up chat prompts: the loaders compared, nothing graded
    return 0


if __name__ == "__main__":
    sys.exit(main())
