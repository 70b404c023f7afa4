"""The vllm-server engine (``engines/vllm_server.py``) against a stand-in ``vllm serve``.

``tests/unit/fake_vllm_server.py`` answers the four endpoints the engine uses with scripted samples
that depend on the seed and on the weights it last reloaded; a wrapper script stands in for the
vLLM venv's python. These tests check posttrain's side: the command line and environment, the
request per (prompt, sample), the mapping of a choice onto a ``Completion``, the weight sync (file
written, reloaded, deleted, prefix cache reset), and that the server stops however the engine's
process ends. ``tests/integration/test_vllm_server_run.py`` runs real vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from posttrain.engines.base import SamplingParams
from posttrain.engines.hf import row_seed
from posttrain.engines.registry import make_engine, sync_weights
from posttrain.errors import UserError
from posttrain.models.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture in tests/conftest.py

FAKE = Path(__file__).with_name("fake_vllm_server.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A stand-in python that runs the fake server; returns (python, log records reader)."""
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    py.chmod(0o755)
    log = tmp_path / "fake.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the engine must not pass it on

    def records() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return str(py), records


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_dead(pid: int, timeout: float = 20.0) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_config_selects_the_engine_and_rejects_its_own_arguments():
    from pydantic import TypeAdapter

    from posttrain.configs.plugins import EngineConfig

    cfg = TypeAdapter(EngineConfig).validate_python("vllm-server")
    assert cfg.type == "vllm-server" and cfg.kv_cache_space_gib == 2 and cfg.max_model_len == 2048
    with pytest.raises(ValueError, match="--port"):
        TypeAdapter(EngineConfig).validate_python({"type": "vllm-server", "server_args": ["--port=9"]})


def test_missing_interpreter_is_a_clear_error(tiny, tmp_path):
    with pytest.raises(UserError, match="make setup-vllm"):
        make_engine({"type": "vllm-server", "python": str(tmp_path / "nope" / "python")}, tiny.model, tiny.tokenizer)


def test_startup_failure_reports_the_servers_log(tiny, fake, monkeypatch):
    py, _ = fake
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    with pytest.raises(UserError, match="(?s)exited with code 3.*fake start-up failure"):
        make_engine({"type": "vllm-server", "python": py}, tiny.model, tiny.tokenizer)


def test_generate_requests_and_completions(tiny, fake):
    py, records = fake
    gen = make_engine({"type": "vllm-server", "python": py, "kv_cache_space_gib": 3, "server_args": ["--foo", "1"]},
                      tiny.model, tiny.tokenizer, batch_size=8)
    try:
        start = records()[0]
        argv = start["argv"]
        assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
        args = {a: (argv[k + 1] if k + 1 < len(argv) and not argv[k + 1].startswith("--") else True)
                for k, a in enumerate(argv) if a.startswith("--")}
        assert args["--enforce-eager"] is True
        assert args["--logprobs-mode"] == "processed_logprobs" and args["--generation-config"] == "vllm"
        assert args["--max-num-seqs"] == "8" and args["--host"] == "127.0.0.1" and args["--port"] == str(gen.port)
        assert args["--max-model-len"] == "2048" and args["--foo"] == "1"
        assert (Path(args["--model"]) / "config.json").is_file()  # the policy's current weights, saved
        assert start["env"] == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "3"}
        # PYTHONPATH: the worker extension alone (not the caller's PYTHONPATH), named on the command line
        assert start["pythonpath"] == ["posttrain_vllm_ext.py"]
        assert args["--worker-extension-cls"] == "posttrain_vllm_ext.WorkerExtension"

        prompts = [[{"role": "user", "content": "What is 2 + 2?"}], [{"role": "user", "content": "hi"}]]
        params = SamplingParams(max_new_tokens=6, temperature=0.7, n=3, seed=5)
        out = gen.generate(prompts, params)
        reqs = [r["body"] for r in records() if r.get("path") == "/v1/completions"]
        assert len(reqs) == 6 and len(out) == 2 and all(len(c) == 3 for c in out)
        rendered = [gen.render_prompt(p, None) for p in prompts]
        by_seed = {r["seed"]: r for r in reqs}
        stop = gen.stop_ids
        for i, comps in enumerate(out):
            for j, c in enumerate(comps):
                r = by_seed[row_seed(row_seed(5, i), j)]  # each row its own seed, as in the other engines
                assert r["prompt"] == rendered[i] == c.prompt_ids
                assert (r["n"], r["logprobs"], r["return_token_ids"], r["temperature"], r["max_tokens"]) == (1, 0, True, 0.7, 6)
                assert r["stop_token_ids"] == sorted(stop) and stop and r["ignore_eos"] is False
                assert len(c.token_ids) == len(c.logprobs) and c.logprobs[0] == -0.25
                if r["seed"] % 2 == 0:  # the fake stops even seeds with the stop token
                    assert c.finish_reason == "stop" and c.token_ids[-1] in stop
                    assert c.text == tiny.tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
                else:
                    assert c.finish_reason == "length" and len(c.token_ids) == 6
        assert gen.generate(prompts, params) == out  # same seeds, same samples
        assert gen.generate_ids([rendered[1]], SamplingParams(max_new_tokens=2), seeds=[77])[0][0].prompt_ids == rendered[1]
        assert [r for r in records() if r.get("path") == "/v1/completions"][-1]["body"]["seed"] == row_seed(77, 0)
        with pytest.raises(ValueError, match="seeds"):
            gen.generate_ids(rendered, SamplingParams(), seeds=[1])
    finally:
        gen.close()


def test_sync_weights_writes_reloads_deletes_and_resets(tiny, fake):
    import copy

    py, records = fake
    policy = copy.deepcopy(tiny.model)
    gen = make_engine({"type": "vllm-server", "python": py}, policy, tiny.tokenizer, batch_size=4)
    try:
        prompts = [[{"role": "user", "content": "What is 2 + 2?"}]]
        params = SamplingParams(max_new_tokens=5, seed=1)
        before = gen.generate(prompts, params)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.01)
        sync_weights(gen, policy)  # what train_rl does after each optimizer step
        reload = [r for r in records() if "reloaded" in r][-1]
        names = dict(policy.named_parameters())
        tied = policy.config.tie_word_embeddings
        assert set(reload["reloaded"]) == {n for n in policy.state_dict() if not (tied and n == "lm_head.weight")}
        assert reload["files"] == ["model.safetensors"]  # complete, renamed before the reload
        rpc = [r["body"] for r in records() if r.get("path") == "/collective_rpc"][-1]
        assert rpc["method"] == "posttrain_reload_weights"
        assert os.listdir(rpc["kwargs"]["weights_path"]) == []  # deleted after the reload
        paths = [r.get("path") for r in records() if "path" in r]
        assert paths[-2:] == ["/collective_rpc", "/reset_prefix_cache"]
        assert set(gen.last_sync) == {"write_s", "reload_s", "reset_s", "total_s", "worker_reload_s", "worker_refresh_s"}
        assert gen.last_sync["worker_refresh_s"] == 0.25
        after = gen.generate(prompts, params)
        assert after[0][0].token_ids != before[0][0].token_ids  # the server samples from the new weights
        assert names  # (policy untouched by the sync)

        gen.load_weights(list(tiny.model.state_dict().items()))  # the weight-sync backends' entry point
        assert [r.get("path") for r in records() if "path" in r][-1] == "/reset_prefix_cache"
        weights_dir = rpc["kwargs"]["weights_path"]
    finally:
        gen.close()
    assert not os.path.exists(weights_dir)


def test_close_stops_the_server_and_its_children(tiny, fake, monkeypatch):
    py, records = fake
    monkeypatch.setenv("FAKE_VLLM_CHILD", "1")
    gen = make_engine({"type": "vllm-server", "python": py}, tiny.model, tiny.tokenizer)
    server, child = records()[0]["pid"], records()[1]["child"]
    assert alive(server) and alive(child)
    model_dir = Path(gen.log_path).parent
    gen.close()
    assert wait_dead(server) and wait_dead(child) and not model_dir.exists()
    gen.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        gen.generate_ids([[1, 2]], SamplingParams(max_new_tokens=1))


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_server_stops_when_the_trainer_dies(fake, tmp_path, how):
    """The trainer killed outright (no ``close``, no atexit): the server is told to stop
    (``PR_SET_PDEATHSIG``) and goes."""
    py, records = fake
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from posttrain.models.loading import load_model
        from posttrain.engines.registry import make_engine
        m = load_model("tiny-llama", device="cpu")
        gen = make_engine({{"type": "vllm-server", "python": {py!r}, "weights_dir": {str(tmp_path)!r}}}, m.model, m.tokenizer)
        print("ready", flush=True)
        time.sleep(600)
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}  # a killed trainer leaves its directories
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        server = records()[0]["pid"]
        assert alive(server)
        proc.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
        proc.wait(30)
        assert wait_dead(server)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_synth_generates_through_a_vllm_server_it_starts(fake, tmp_path, monkeypatch):
    """``generation.model: vllm-server:MODEL``: synth's rows come from the server it started, each
    row with its own seed, and the server is stopped when the command ends."""
    from posttrain.cli import main

    python, records = fake
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(python, venv / "bin" / "python")
    monkeypatch.setenv("POSTTRAIN_VLLM_VENV", str(venv))
    cfg = tmp_path / "synth.yaml"
    cfg.write_text(textwrap.dedent("""\
        rows: 3
        columns:
          n: {type: int, low: 1, high: 9}
          ans: {type: model, prompt: "say {n}", max_new_tokens: 6}
        messages:
          - {role: user, content: "say {n}"}
          - {role: assistant, content: "{ans}"}
        final: {filters: null, dedup: null}
        generation: {model: "vllm-server:tiny-llama", batch_rows: 3, temperature: 1.0}
        """))
    out = tmp_path / "out.jsonl"
    assert main(["synth", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["model"] == "vllm-server:tiny-llama" and summary["rows_processed"] == 3
    sampled = [r for r in records() if r.get("path") == "/v1/completions"]
    assert len(sampled) == 3 and len({r["body"]["seed"] for r in sampled}) == 3  # a seed per row
    started = [r for r in records() if "argv" in r]
    assert len(started) == 1 and wait_dead(started[0]["pid"])  # stopped when synth ended


def test_no_stop_ids_decodes_to_the_limit_as_the_hf_engine_does():
    from posttrain.engines.vllm_server import request_body

    params = SamplingParams(max_new_tokens=5)
    assert request_body([1, 2], params, 0, frozenset())["ignore_eos"] is True  # a bench's fixed batch
    assert request_body([1, 2], params, 0, frozenset({7}))["ignore_eos"] is False


def test_group_cpu_seconds_counts_a_grandchild():
    """A server's engine core is its child: the group's CPU time must include it (the parent here
    idles; only its child burns 0.5 CPU s)."""
    from posttrain.engines.vllm_server import group_cpu_seconds

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(60)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {burn!r}]); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        t0 = time.time()
        while group_cpu_seconds(p.pid) < 0.5 and time.time() - t0 < 30:
            time.sleep(0.2)
        assert group_cpu_seconds(p.pid) >= 0.5
        assert group_cpu_seconds(2 ** 22 + 7) == 0.0  # no such group
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_server_cpu_is_counted_while_it_runs_and_after_it_stops(tiny, fake, monkeypatch):
    """The pipeline's stage clock (experiments/stages.py: cpu_seconds) adds ``server_cpu_seconds``:
    a stopped server's CPU time must not vanish from it."""
    from posttrain.engines.vllm_server import group_cpu_seconds, server_cpu_seconds

    py, _ = fake
    monkeypatch.setenv("FAKE_VLLM_CHILD", "1")
    start = server_cpu_seconds()
    gen = make_engine({"type": "vllm-server", "python": py}, tiny.model, tiny.tokenizer)
    spent = group_cpu_seconds(gen._proc.pid)
    assert spent > 0  # two Python interpreters started: at least a clock tick
    eps = 1e-9  # sums of clock ticks in float: 45.03 − 44.95 is 0.07999… (a CI failure once)
    assert server_cpu_seconds() - start >= spent - eps
    gen.close()
    assert server_cpu_seconds() - start >= spent - eps
