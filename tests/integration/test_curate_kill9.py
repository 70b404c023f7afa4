"""Real kill -9 of ``posttrain curate``, then ``--resume``: the output is byte-identical to an
uninterrupted run (issue 12, item 11: a resumed run sampled other rows, 19 instead of 18).

The process kills itself with SIGKILL after writing its 6th prompt (``POSTTRAIN_FAULT_AFTER_PROMPT``,
curate's fault hook), in the middle of a batch of 4, so the resumed run batches the rest
differently from the uninterrupted one (before the fix, prompts were seeded by their place in the
batch). The command runs through ``posttrain.cli.main`` in a fresh interpreter with one test
environment registered, and the tiny random teacher is nudged to end its turns (a bias on the
``<|im_end|>`` logit), so candidates finish, pass the filters and some are verified.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DRIVER = '''
import sys
import torch
from posttrain.envs.base import ENVIRONMENTS, Environment, Task, VerifyResult, final_answer_text
from posttrain.engines.hf import HFGenerator
from posttrain.models.chat_template import IM_END

@ENVIRONMENTS.register("test_curate_kill9")
class SomeKept(Environment):
    name, domain = "test_curate_kill9", "test"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"c9/{i}", domain="test", messages=[{"role": "user", "content": f"Write about {i}."}])
                for i in range(n or 10)]

    def verify(self, task, messages):
        return VerifyResult(float(len(final_answer_text(messages)) % 3 != 0))

_from_spec = HFGenerator.from_spec.__func__

def from_spec(cls, spec, **kwargs):
    gen = _from_spec(cls, spec, **kwargs)
    stop = gen.tokenizer.convert_tokens_to_ids(IM_END)
    def end_sooner(module, inputs, out):
        bias = torch.zeros(out.shape[-1], dtype=out.dtype)
        bias[stop] = 5.0
        return out + bias
    gen.model.lm_head.register_forward_hook(end_sooner)
    return gen

HFGenerator.from_spec = classmethod(from_spec)

from posttrain.cli import main
sys.exit(main(sys.argv[1:]))
'''


def _run(driver: Path, out: Path, *extra: str, fault_after: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("POSTTRAIN_FAULT_AFTER_PROMPT", None)
    if fault_after is not None:
        env["POSTTRAIN_FAULT_AFTER_PROMPT"] = str(fault_after)
    argv = ["curate", "--env", "test_curate_kill9", "--limit", "10", "--teacher", "tiny-llama", "--n", "4",
            "--k", "2", "--max-new-tokens", "8", "--temperature", "1.0", "--batch-prompts", "4", "--seed", "1",
            "--out", str(out), *extra]
    return subprocess.run([sys.executable, str(driver), *argv], env=env, capture_output=True, text=True, timeout=300)


def test_curate_kill9_mid_batch_and_resume_gives_the_same_file(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    full, killed = tmp_path / "full.jsonl", tmp_path / "killed.jsonl"
    r = _run(driver, full)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in full.read_text().splitlines()]
    s = json.loads((tmp_path / "full.summary.json").read_text())
    # the comparison means something: rows kept from most prompts, and candidates dropped for
    # several reasons (the global near-duplicate index carries over a resume too)
    assert len({r["prompt_id"] for r in rows}) >= 5 and s["kept"] == len(rows) and len(s["dropped"]) >= 2, s

    r = _run(driver, killed, fault_after=6)
    assert r.returncode == -9, r.stderr[-3000:]  # really died by SIGKILL
    done = [json.loads(x) for x in (tmp_path / "killed.jsonl.done").read_text().splitlines()]
    assert done == [f"c9/{i}" for i in range(6)]  # in the middle of the second batch (c9/4 .. c9/7)
    assert not (tmp_path / "killed.summary.json").exists()

    r = _run(driver, killed, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert killed.read_bytes() == full.read_bytes()
    resumed = json.loads((tmp_path / "killed.summary.json").read_text())
    assert resumed["prompts_skipped_done"] == 6 and resumed["prompts_processed"] == 4
