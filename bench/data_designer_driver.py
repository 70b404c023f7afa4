"""NeMo Data Designer's side of bench/synth_vs_data_designer.py: one model column over a seed dataset,
against an OpenAI-compatible endpoint. Runs in Data Designer's own venv (not posttrain's), as

    /tmp/dd-venv/bin/python bench/data_designer_driver.py '<json args>'

Args (one JSON object): endpoint, model, seed_path, prompt (Jinja2, e.g. ``... {{ passage }}``), rows,
temperature, top_p, max_tokens, max_parallel_requests, artifact_dir. Prints one line
``DD_RESULT {json}``: the wall time of ``DataDesigner.create`` (everything a user waits for once the
server is up: its model health probe, generation, parquet writing, its profiler), the rows, their
texts, the artifact files, and every connection attempt to a non-loopback address (refused: an
audit hook blocks them, so a run that tried to phone out says so instead of doing it).

Telemetry is off through ``NEMO_TELEMETRY_ENABLED=false`` (data_designer/engine/models/telemetry.py
reads it at import; the bench sets it in the environment, and ``main`` sets it again before the
first import). Imports only the standard library at module level.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import time

BLOCKED: list[str] = []


def _loopback(host: object) -> bool:
    if host in ("localhost", None, ""):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _audit(event: str, args: tuple) -> None:
    """Refuse (and record) any connection or name lookup that leaves the machine."""
    if event == "socket.connect":
        addr = args[1]
        if isinstance(addr, tuple) and not _loopback(addr[0]):
            BLOCKED.append(f"connect {addr[0]}:{addr[1]}")
            raise ConnectionRefusedError(f"bench: non-loopback connection to {addr} blocked")
    elif event == "socket.getaddrinfo":
        if not _loopback(args[0]):
            BLOCKED.append(f"getaddrinfo {args[0]}")
            raise OSError(f"bench: name lookup of {args[0]!r} blocked")


def main() -> None:
    a = json.loads(sys.argv[1])
    os.environ["NEMO_TELEMETRY_ENABLED"] = "false"  # before data_designer's first import (telemetry.py reads it then)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.addaudithook(_audit)
    os.environ.setdefault("DATA_DESIGNER_HOME", os.path.join(a["artifact_dir"], "home"))

    import data_designer.config as dd
    from data_designer.interface import DataDesigner

    provider = dd.ModelProvider(name="local-vllm", endpoint=a["endpoint"], provider_type="openai", api_key="none")
    model = dd.ModelConfig(
        alias="local", model=a["model"], provider="local-vllm",
        inference_parameters=dd.ChatCompletionInferenceParams(
            temperature=a["temperature"], top_p=a["top_p"], max_tokens=a["max_tokens"],
            max_parallel_requests=a["max_parallel_requests"]))
    builder = dd.DataDesignerConfigBuilder(model_configs=[model])
    builder.with_seed_dataset(dd.LocalFileSeedSource(path=a["seed_path"]))  # ORDERED: row i gets passage i
    builder.add_column(dd.LLMTextColumnConfig(name="answer", model_alias="local", prompt=a["prompt"]))
    designer = DataDesigner(artifact_path=a["artifact_dir"], model_providers=[provider])

    t0 = time.time()
    result = designer.create(builder, num_records=a["rows"], dataset_name="bench")
    elapsed = time.time() - t0
    df = result.load_dataset()
    texts = [str(x) if x is not None else "" for x in df["answer"].tolist()] if "answer" in df else []
    files = sorted(os.path.relpath(os.path.join(d, f), a["artifact_dir"])
                   for d, _, fs in os.walk(a["artifact_dir"]) for f in fs)
    print("DD_RESULT " + json.dumps({
        "elapsed": elapsed, "rows": len(df), "nonempty": sum(bool(t.strip()) for t in texts),
        "columns": list(df.columns), "texts": texts, "files": files, "blocked": BLOCKED,
    }), flush=True)


if __name__ == "__main__":
    main()
