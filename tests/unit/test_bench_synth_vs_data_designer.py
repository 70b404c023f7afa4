"""bench/synth_vs_data_designer.py without a server or Data Designer: the job both tools run is the same
(prompt text, rows, sampling, concurrency), the server's counters are read right, and the driver's
guard refuses connections that leave the machine."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.script_module import script_module


def args(**kw):
    base = dict(rows=32, max_new_tokens=48, temperature=0.8, top_p=1.0, concurrency=8)
    return SimpleNamespace(**{**base, **kw})


def test_the_synth_side_is_the_data_designer_job():
    from posttrain.data.synth import build_context, check_config, render

    with script_module("bench", "synth_vs_data_designer") as m:
        cfg = m.synth_config(args(), "http://127.0.0.1:8771/v1#embedded")
        check_config(cfg, None)  # the config and DAG are valid; no model loads
        build_context(cfg)  # the seed file loads
        assert cfg.rows == 32 and cfg.generation.batch_rows == 8 and cfg.max_attempts == 1
        assert (cfg.generation.temperature, cfg.generation.top_p, cfg.generation.max_new_tokens) == (0.8, 1.0, 48)
        assert cfg.final.filters is None and cfg.final.dedup is None
        seeds = [json.loads(x) for x in m.SEEDS.read_text().splitlines()]
        # Data Designer renders "{{ passage }}" of seed row i (ordered); synth renders "{s}" of seed row i
        dd_prompt = m.TEMPLATE.replace("{passage}", "{{ passage }}").replace("{{ passage }}", seeds[0]["passage"])
        assert render(cfg.columns["answer"].prompt, {"s": seeds[0]["passage"]}) == dd_prompt


def test_server_counters_sum_over_labels():
    text = "\n".join([
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        'vllm:generation_tokens_total{engine="0",model_name="embedded"} 290.0',
        'vllm:prompt_tokens_total{engine="0",model_name="embedded"} 523.0',
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="embedded"} 5.0',
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="embedded"} 3.0',
        'vllm:generation_tokens_created{engine="0",model_name="embedded"} 1.7e9',
    ])
    with script_module("bench", "synth_vs_data_designer") as m:
        assert m.parse_counters(text) == {"vllm:generation_tokens_total": 290.0, "vllm:prompt_tokens_total": 523.0,
                                          "vllm:request_success_total": 8.0}


def test_driver_refuses_non_loopback_connections():
    with script_module("bench", "data_designer_driver") as d:
        d.BLOCKED.clear()
        d._audit("socket.connect", (None, ("127.0.0.1", 8771)))
        d._audit("socket.connect", (None, ("::1", 8771, 0, 0)))
        d._audit("socket.getaddrinfo", ("localhost", 8771, 0, 0, 0))
        assert d.BLOCKED == []
        with pytest.raises(ConnectionRefusedError):
            d._audit("socket.connect", (None, ("203.0.113.5", 443)))
        with pytest.raises(OSError):
            d._audit("socket.getaddrinfo", ("events.telemetry.data.nvidia.com", 443, 0, 0, 0))
        assert d.BLOCKED == ["connect 203.0.113.5:443", "getaddrinfo events.telemetry.data.nvidia.com"]
