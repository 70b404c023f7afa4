"""A stand-in for ``vllm serve`` (tests/unit/test_vllm_server.py): the HTTP surface the vllm-server
engine uses, in the standard library plus safetensors.

Started as ``python fake_vllm_server.py -m vllm.entrypoints.openai.api_server --model DIR --port N
...`` (the engine's command line, behind a wrapper script that stands in for the venv's python).
Answers ``GET /v1/models``; ``POST /v1/completions`` with a scripted sample that depends on the
seed, the prompt and the *weights version* (so a weight sync visibly changes the samples);
``POST /collective_rpc`` ``posttrain_reload_weights`` (the worker extension's method) reads the safetensors file in ``weights_path`` and bumps
the version to a checksum of what it read; ``POST /reset_prefix_cache``. Every request is appended
to ``$FAKE_VLLM_LOG`` as a JSON line. ``$FAKE_VLLM_FAIL=1``: exit at once with an error (start-up
failure). ``$FAKE_VLLM_CHILD=1``: also start a child process in the same group (vLLM's engine core),
whose pid is logged, to check that stopping the server takes its children along.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STOP = 2  # the tiny tokenizer's eos
STATE = {"version": 0, "resets": 0}


def log(record: dict) -> None:
    with open(os.environ["FAKE_VLLM_LOG"], "a") as f:
        f.write(json.dumps(record) + "\n")


def sample(body: dict) -> dict:
    """A deterministic choice: ``max_tokens`` ids from the seed, prompt and weights version; a row
    whose seed is even stops early with the stop token, an odd one runs to the limit."""
    seed, n = int(body["seed"]), int(body["max_tokens"])
    base = (seed + sum(body["prompt"]) + 7 * STATE["version"]) % 40 + 10
    ids = [base + k % 5 for k in range(n)]
    reason = "length"
    if seed % 2 == 0:
        ids = ids[: max(1, n // 2) - 1] + [STOP]
        reason = "stop"
    return {"index": 0, "text": "", "token_ids": ids, "finish_reason": reason,
            "logprobs": {"token_logprobs": [-0.25 * (1 + k % 3) for k in range(len(ids))], "tokens": [],
                         "top_logprobs": [], "text_offset": []}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, payload=None):
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"data": [{"id": "policy"}]})
        else:
            self._send(404, {"error": self.path})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        log({"path": self.path, "body": body, "version": STATE["version"]})
        if self.path == "/v1/completions":
            self._send(200, {"choices": [sample(body)]})
        elif self.path == "/collective_rpc":
            if body.get("method") != "posttrain_reload_weights":
                self._send(400, {"error": f"unknown method {body.get('method')}"})
                return
            from safetensors.torch import load_file

            d = body["kwargs"]["weights_path"]
            files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
            tensors = {k: v for f in files for k, v in load_file(os.path.join(d, f)).items()}
            STATE["version"] = int(sum(float(v.float().sum()) for v in tensors.values()) * 1000) % 997 + 1
            log({"reloaded": sorted(tensors), "files": os.listdir(d), "version": STATE["version"]})
            self._send(200, {"results": [{"reload_s": 0.5, "refresh_s": 0.25, "lm_heads_refreshed": 1}]})
        elif self.path == "/reset_prefix_cache":
            STATE["resets"] += 1
            self._send(200)
        else:
            self._send(404, {"error": self.path})


def main(argv: list[str]) -> None:
    port = int(argv[argv.index("--port") + 1])
    if os.environ.get("FAKE_VLLM_FAIL"):
        print("ValueError: fake start-up failure", flush=True)
        sys.exit(3)
    ext = os.environ.get("PYTHONPATH", "")
    log({"argv": argv, "env": {k: os.environ.get(k) for k in ("VLLM_SERVER_DEV_MODE", "VLLM_CPU_KVCACHE_SPACE")},
         "pythonpath": sorted(os.listdir(ext)) if os.path.isdir(ext) else ext, "pid": os.getpid()})
    if os.environ.get("FAKE_VLLM_CHILD"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        log({"child": child.pid})
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
