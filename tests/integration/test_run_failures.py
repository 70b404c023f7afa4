"""Runs that meet bad data, a full disk, a diverging optimizer or a wrong setting (issue 12 items 10,
12, 13, 16, and the silent truncation of item 18): each finishes, resumes, or stops with one line
that says what to do, and never leaves a checkpoint a resume cannot use.

Everything runs on tiny-llama for a few steps; the CLI cases that need no model fail before one
loads.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain import cli
from posttrain.configs import load_config
from posttrain.configs.sft import SFTConfig
from posttrain.data.conversations import write_jsonl
from posttrain.data.synthetic import arithmetic_rows
from posttrain.train.checkpoint import latest_checkpoint
from posttrain.train.metrics import read_metrics
from posttrain.train.sft import train_sft

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LEN = 128


def _long_prompt_row(chars: int) -> dict:
    return {"messages": [{"role": "user", "content": "word " * (chars // 5)}, {"role": "assistant", "content": "ok"}]}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "arith.jsonl"
    write_jsonl(arithmetic_rows(40, seed=3, max_digits=1), p)
    return p


@pytest.fixture(scope="module")
def overlong_file(tmp_path_factory) -> Path:
    """Arithmetic rows, 3 rows whose prompt alone is longer than MAX_LEN, and 2 whose assistant
    reply runs past it (one of them 1 MB)."""
    rows = list(arithmetic_rows(24, seed=5, max_digits=1))
    rows += [_long_prompt_row(2_000) for _ in range(3)]
    rows += [{"messages": [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": "x " * 300}]},
             {"messages": [{"role": "user", "content": "Say more."}, {"role": "assistant", "content": "y" * 1_000_000}]}]
    p = tmp_path_factory.mktemp("data") / "overlong.jsonl"
    write_jsonl(rows, p)
    return p


def _cfg(data: Path, run_dir: Path, **over: str) -> SFTConfig:
    base = {"model": "tiny-llama", "run_dir": str(run_dir), "train.steps": "4", "train.batch_size": "8",
            "train.save_every": "2", "optim.lr": "3e-3", "optim.warmup_steps": "1",
            "data.max_seq_len": str(MAX_LEN), "data.val_frac": "0.1", "data.reasoning_off_frac": "0",
            "data.budget_frac": "0"}
    base.update(over)
    return load_config(SFTConfig, None, [f"{k}={v}" for k, v in base.items()] + [f"data.train=[{{path: {data}}}]"])


def _finite(ckpt: Path) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in load_file(str(ckpt / "model.safetensors")).values())


# --------------------------------------------------------------------------- item 10 (+ 18)


def test_overlong_prompt_rows_are_skipped_with_a_count_and_the_run_finishes_and_resumes(overlong_file, tmp_path,
                                                                                          capsys):
    cfg = _cfg(overlong_file, tmp_path / "run")
    train_sft(cfg, progress=False, stop_after=2)  # as if killed after the step-2 checkpoint
    out = capsys.readouterr().out
    # val_frac holds one row out, which may be an over-long one: count the file's lines over both
    skipped = [line for line in out.splitlines() if "before any assistant token: skipped" in line]
    assert skipped and all(f"data.max_seq_len={MAX_LEN}" in line for line in skipped), out
    assert sum(int(line.split(": ")[1].split()[0]) for line in skipped) == 3, out
    cut = [line for line in out.splitlines() if f"cut at data.max_seq_len={MAX_LEN}" in line]
    assert cut and "assistant tokens not trained on" in cut[0], out  # the 1 MB reply is reported, not silent

    res = train_sft(cfg, progress=False)  # the resume redraws the same batches, over-long rows and all
    assert "resuming from" in capsys.readouterr().out
    assert res.checkpoint.name == "step_000004" and _finite(res.checkpoint)
    assert (res.steps, res.start_step) == (4, 2)  # steps 3-4 ran here: the pipeline paces a resumed stage by them
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)


def test_tokenize_rows_cuts_to_max_len_and_counts_what_it_cut():
    from posttrain.models.tiny import tiny_tokenizer
    from posttrain.data.examples import tokenize_rows

    tok = tiny_tokenizer()
    rows = [_long_prompt_row(2_000),
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "z" * 1_000_000}]},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "fine"}]}]
    examples, rep = tokenize_rows(tok, rows, MAX_LEN)
    assert len(examples) == 2 and all(len(e) <= MAX_LEN and any(e.loss_mask[1:]) for e in examples)
    assert (rep.prompt_too_long, rep.cut) == (1, 1) and rep.cut_tokens > 100_000
    assert any("1 rows longer than data.max_seq_len=128 before any assistant token: skipped" in line
               for line in rep.lines("f.jsonl"))


def test_a_step_with_no_trainable_token_takes_no_update_and_is_counted(data_file, tmp_path, monkeypatch):
    from posttrain.train import sft
    from posttrain.train.loop import StepBatch

    real = sft.SFTStage.prepare

    def prepare(self, step):  # step 2's batch ends up with no trainable token
        b = real(self, step)
        return StepBatch([], {**b.metrics, "target_tokens": 0, "rows": 0}) if step == 1 else b

    monkeypatch.setattr(sft.SFTStage, "prepare", prepare)
    train_sft(_cfg(data_file, tmp_path / "run", **{"train.steps": "3"}), progress=False)
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run") if r["step"] > 0}
    assert rows[2].get("update_skipped") == 1.0 and "loss" not in rows[2]
    assert "update_skipped" not in rows[1] and math.isfinite(rows[3]["loss"])


def test_heldout_loss_with_no_tokens_is_nan_not_zero():
    from posttrain.models.loading import load_model
    from posttrain.train.autocast import autocast
    from posttrain.train.sft import heldout_loss

    m = load_model("tiny-llama")
    stats = heldout_loss(m.model, [], MAX_LEN, True, 0, lambda: autocast("fp32", "cpu"))
    assert math.isnan(stats.loss) and stats.tokens == 0


# --------------------------------------------------------------------------- item 12


def test_torn_metrics_line_is_dropped_with_a_warning_and_the_run_resumes(data_file, tmp_path, capsys):
    cfg = _cfg(data_file, tmp_path / "run")
    train_sft(cfg, progress=False, stop_after=2)
    metrics = tmp_path / "run" / "metrics.jsonl"
    with open(metrics, "a") as f:  # the disk filled up in the middle of step 3's line
        f.write('{"step": 3, "time": 17.5, "lo')
    capsys.readouterr()
    res = train_sft(cfg, progress=False)
    out = capsys.readouterr().out
    assert "resuming from" in out and "torn or corrupt line" in out
    assert res.checkpoint.name == "step_000004"
    lines = metrics.read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # every line parses again
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert not metrics.with_name("metrics.jsonl.tmp").exists()


def test_a_fresh_start_moves_an_earlier_runs_metrics_aside_instead_of_appending(data_file, tmp_path, capsys):
    """A run directory whose checkpoints are gone starts over; its old step lines must not be counted
    again (the pipeline's same-tokens control sums ``tokens`` over metrics.jsonl)."""
    import shutil

    cfg = _cfg(data_file, tmp_path / "run")
    train_sft(cfg, progress=False, stop_after=2)
    run = tmp_path / "run"
    old = (run / "metrics.jsonl").read_text()
    shutil.rmtree(run / "checkpoints")  # as a user (or a released stage) leaves it
    capsys.readouterr()
    train_sft(cfg, progress=False, stop_after=2)
    assert "metrics.previous-1.jsonl" in capsys.readouterr().out
    assert (run / "metrics.previous-1.jsonl").read_text() == old
    steps = [r["step"] for r in read_metrics(run) if "loss" in r]
    assert steps == [1, 2]  # once each, not [1, 2, 1, 2]


def test_metrics_readers_skip_a_corrupt_line(tmp_path, capsys):
    from posttrain.train.metrics import MetricsLogger, truncate_metrics

    log = MetricsLogger(tmp_path)
    log.log(1, {"loss": 1.0})
    with open(log.path, "a") as f:
        f.write('{"step": 2, "lo\n')
    log.log(3, {"loss": float("nan")})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 3]
    truncate_metrics(tmp_path, 1)
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [1]
    assert "warning" in capsys.readouterr().out


# --------------------------------------------------------------------------- item 13


def test_huge_lr_stops_with_one_line_and_keeps_the_last_finite_checkpoint(data_file, tmp_path, capsys):
    run = tmp_path / "run"
    rc = cli.main(["sft", "--no-progress", "model=tiny-llama", f"run_dir={run}", "train.steps=5",
                   "train.save_every=1", "train.batch_size=4", f"data.max_seq_len={MAX_LEN}", "optim.lr=1e30",
                   "optim.warmup_steps=0", f"data.train=[{{path: {data_file}}}]"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: step ") and "optim.lr" in err and "diverged" in err
    last = latest_checkpoint(run)
    if last is not None:  # the checkpoints that were written hold finite weights and load
        from transformers import AutoModelForCausalLM

        assert _finite(last)
        AutoModelForCausalLM.from_pretrained(last)
    failed_at = int(err.split("step ")[1].split(":")[0])
    assert not (run / "checkpoints" / f"step_{failed_at:06d}").exists()


# --------------------------------------------------------------------------- item 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    from posttrain.models.loading import load_model
    from posttrain.train.checkpoint import save_hf_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    m = load_model("tiny-llama")
    save_hf_model(m.model, m.tokenizer, out)
    return out


def _sft(run: Path, data: Path, *over: str) -> list[str]:
    return ["sft", "--no-progress", "model=tiny-llama", f"run_dir={run}", "train.steps=2", "train.batch_size=4",
            f"data.max_seq_len={MAX_LEN}", f"data.train=[{{path: {data}}}]", *over]


def _rl(run: Path, *over: str) -> list[str]:
    return ["rl", "--no-progress", "model=tiny-llama", f"run_dir={run}", "train.steps=1", "train.eval_every=0",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", *over]


def case_unknown_env(tmp, data, model_dir, monkeypatch):
    return _rl(tmp / "run", "envs=[{name: nosuch_env}]"), "unknown environment 'nosuch_env'"


def case_bad_env_args(tmp, data, model_dir, monkeypatch):
    return _rl(tmp / "run", "envs=[{name: math, args: {colour: red}}]"), "envs[0].args"


def case_bad_plugin_args(tmp, data, model_dir, monkeypatch):
    return _rl(tmp / "run", "algo.loss={type: pg, clip_hihg: 0.3}"), "algo.loss.pg.clip_hihg: unknown field"


def case_missing_profile(tmp, data, model_dir, monkeypatch):
    return _rl(tmp / "run", f"curriculum.profile={tmp / 'none.jsonl'}"), "posttrain profile"


def case_unreachable_env_url(tmp, data, model_dir, monkeypatch):
    url = f"http://127.0.0.1:{_free_port()}"
    return _rl(tmp / "run", f"envs=[{{name: math, url: '{url}'}}]"), "cannot be reached"


def _gym_rows(tmp) -> Path:
    rows = tmp / "gym_rows.jsonl"
    rows.write_text(json.dumps({"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}) + "\n")
    return rows


def case_unreachable_gym_url(tmp, data, model_dir, monkeypatch):
    url = f"http://127.0.0.1:{_free_port()}"
    entry = f"{{name: gym_x, url: '{url}', protocol: gym, dataset: '{_gym_rows(tmp)}', args: {{backoff_s: 0.01}}}}"
    return _rl(tmp / "run", f"envs=[{entry}]"), "envs[0].url: the NeMo Gym resource server"


def case_missing_gym_dataset(tmp, data, model_dir, monkeypatch):
    url = f"http://127.0.0.1:{_free_port()}"
    entry = f"{{name: gym_x, url: '{url}', protocol: gym, dataset: '{tmp / 'none.jsonl'}'}}"
    return _rl(tmp / "run", f"envs=[{entry}]"), "envs[0].dataset"


def case_read_only_run_dir(tmp, data, model_dir, monkeypatch):
    parent = tmp / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    if os.geteuid() == 0:  # permission bits do not bind root: fail the first write as the OS would
        def refuse(cfg, run_dir):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(run_dir))

        monkeypatch.setattr("posttrain.train.loop.save_config", refuse)
    return _sft(parent / "run", data), "set run_dir= to a writable directory"


def case_run_dir_under_a_file(tmp, data, model_dir, monkeypatch):
    (tmp / "afile").write_text("x")
    return _sft(tmp / "afile" / "run", data), "cannot write the run directory"


def case_directory_as_data_file(tmp, data, model_dir, monkeypatch):
    return _sft(tmp / "run", tmp), "is a directory"


def case_corrupt_model_safetensors(tmp, data, model_dir, monkeypatch):
    import shutil

    bad = tmp / "bad_model"
    shutil.copytree(model_dir, bad)
    (bad / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    return _sft(tmp / "run", data, f"model={bad}"), "corrupt or incomplete"


def case_corrupt_checkpoint_on_resume(tmp, data, model_dir, monkeypatch):
    import shutil

    ckpt = tmp / "run" / "checkpoints" / "step_000001"
    shutil.copytree(model_dir, ckpt)
    (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:1000])  # torn
    torch.save({"step": 1}, ckpt / "trainer_state.pt")
    (ckpt.parent / "latest").write_text(ckpt.name)
    return _sft(tmp / "run", data), f"rm -r {ckpt}"


def case_disk_full_during_checkpoint(tmp, data, model_dir, monkeypatch):
    from posttrain.train import checkpoint

    real, calls = checkpoint.save_hf_model, []

    def full_disk(*a, **k):  # the first checkpoint is written; the disk is full at the second
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*a, **k)

    monkeypatch.setattr(checkpoint, "save_hf_model", full_disk)
    return _sft(tmp / "run", data, "train.save_every=1"), "No space left on device"


CASES = [case_unknown_env, case_bad_env_args, case_bad_plugin_args, case_missing_profile, case_unreachable_env_url,
         case_unreachable_gym_url, case_missing_gym_dataset, case_read_only_run_dir, case_run_dir_under_a_file, case_directory_as_data_file,
         case_corrupt_model_safetensors, case_corrupt_checkpoint_on_resume, case_disk_full_during_checkpoint]
NO_MODEL = {case_unknown_env, case_bad_env_args, case_bad_plugin_args, case_missing_profile,
            case_unreachable_env_url, case_unreachable_gym_url, case_missing_gym_dataset, case_read_only_run_dir, case_run_dir_under_a_file, case_directory_as_data_file}


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.removeprefix("case_") for c in CASES])
def test_cli_failure_is_one_line_exit_2(case, data_file, tiny_model_dir, tmp_path, capsys, monkeypatch):
    argv, says = case(tmp_path, data_file, tiny_model_dir, monkeypatch)
    if case in NO_MODEL:  # these must fail before any model loads
        def no_load(*a, **k):
            raise AssertionError("the model was loaded before the setting was checked")

        monkeypatch.setattr("posttrain.models.loading.load_model", no_load)
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert says in err, err
    if case is case_bad_plugin_args:  # fails when the config loads: no run directory is written
        assert not (tmp_path / "run").exists()
    if case is case_disk_full_during_checkpoint:  # the previous checkpoint is intact and still the latest
        ckpts = tmp_path / "run" / "checkpoints"
        assert latest_checkpoint(tmp_path / "run") == ckpts / "step_000001"
        assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]  # no temp dir left
        assert _finite(ckpts / "step_000001")


def test_a_real_failed_checkpoint_write_is_one_line_and_keeps_the_previous_checkpoint(data_file, tmp_path):
    """No monkeypatch: a file-size limit makes the kernel refuse the write (EFBIG) inside safetensors'
    own writer, which wraps it in its own exception type, as it does a full disk's ENOSPC."""
    import subprocess
    import sys
    import textwrap

    run = tmp_path / "run"
    argv = _sft(run, data_file)
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from posttrain import cli
        argv = {[a for a in argv if not a.startswith("train.steps=")]!r}
        assert cli.main(argv + ["train.steps=1"]) == 0
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        sys.exit(cli.main(argv + ["train.steps=2"]))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    err = r.stderr.strip()
    assert r.returncode == 2, err[-3000:]
    assert len(err.splitlines()) == 1 and err.startswith("error: cannot write the step 2 checkpoint"), err
    assert "step_000001, is kept" in err
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]
    assert latest_checkpoint(run) == ckpts / "step_000001" and _finite(ckpts / "step_000001")
