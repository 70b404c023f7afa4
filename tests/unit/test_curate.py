"""The curation pipeline with stand-in generate/verify functions: counts, resume, refresh, CLI."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from posttrain.commands import curate as curate_command
from posttrain.configs.curate import CurateConfig
from posttrain.data.conversations import read_conversations
from posttrain.data.curate import (
    Candidate,
    CurateError,
    GeneratingTeacherPool,
    as_task,
    curate,
    done_path,
    load_output,
    read_prompts,
    refresh_path,
    summary_path,
)
from posttrain.envs.base import Environment, Episode, StepResult, Task, VerifyResult, final_answer_text
from posttrain.models.chat_template import format_tool_call
from posttrain.engines.base import Completion, SamplingParams

VOCAB = [f"w{i}" for i in range(4000)]


def make_tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", domain="arith",
                 messages=[{"role": "user", "content": f"What is {i} + {i}? Put the final answer after 'Answer:'."}],
                 ground_truth=str(2 * i)) for i in range(n)]


def explanation(key: str, n: int = 60) -> str:
    rng = random.Random(key)
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def near_copy(text: str) -> str:
    words = text.split()
    words[len(words) // 2] = "changed"
    return " ".join(words)


def verify(task: Task, messages: list[dict]) -> VerifyResult:
    answer = final_answer_text(messages).strip()
    ok = answer.endswith(f"Answer: {task.ground_truth}")
    return VerifyResult(float(ok), {"exact": float(ok)}, "correct" if ok else f"wrong: expected {task.ground_truth}")


def answer(reasoning: str, value: str) -> list[dict]:
    return [{"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\nAnswer: {value}"}]


class StandIn:
    """generate_fn: per prompt, good answers in ``variants`` plus one of each kind of bad candidate."""

    def __init__(self, teacher: str = "teacher-a", variants=(1, 2, 3), near_dup_of: int | None = 1,
                 bad: bool = True, key=lambda t: t.id, fail_on_call: int | None = None) -> None:
        self.teacher, self.variants, self.near_dup_of, self.bad = teacher, variants, near_dup_of, bad
        self.key, self.fail_on_call = key, fail_on_call
        self.calls: list[list[str]] = []

    def __call__(self, tasks: list[Task]) -> list[list[Candidate]]:
        self.calls.append([t.id for t in tasks])
        if self.fail_on_call == len(self.calls):
            raise RuntimeError("killed")
        return [self.candidates(t) for t in tasks]

    def candidates(self, t: Task) -> list[Candidate]:
        sampling = {"temperature": 0.8, "n": 8}
        gt = t.ground_truth

        def cand(messages, finish="stop"):
            return Candidate(messages, self.teacher, sampling, finish)

        out = [cand(answer(explanation(f"{self.key(t)}-{v}"), gt)) for v in self.variants]
        if self.near_dup_of is not None:
            out.append(cand(answer(near_copy(explanation(f"{self.key(t)}-{self.near_dup_of}")), gt)))
        if self.bad:
            out += [
                cand(answer(explanation(f"{self.key(t)}-wrong"), str(int(gt) + 1))),
                cand(answer("Let me add the numbers again. " * 30, gt)),
                cand([{"role": "assistant", "content": format_tool_call("calculator", {"expr": f"{gt}/2*2"})}]),
                cand(answer(explanation(f"{self.key(t)}-cut"), gt), finish="length"),
            ]
        return out


EXPECTED_DROPS_PER_PROMPT = {
    "filter:repetition:window": 1, "filter:tool_calls:calls_without_tools": 1,
    "filter:truncated:hit_length_limit": 1, "rejected": 1, "near_duplicate": 1, "over_k": 1,
}


def rows_of(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- one run


def test_curate_keeps_verified_diverse_rows_and_counts_every_drop(tmp_path):
    out = tmp_path / "sft.jsonl"
    s = curate(make_tasks(3), StandIn(), verify, CurateConfig(out=out, k=2, batch_prompts=2), log=quiet)
    assert s["candidates"] == 3 * 8 and s["kept"] == 6
    assert s["dropped"] == {k: 3 * v for k, v in EXPECTED_DROPS_PER_PROMPT.items()}
    assert s["rejected_reasons"] == {"wrong": 3}
    assert s["by_teacher"] == {"teacher-a": {"candidates": 24, "verified": 12, "kept": 6}}
    assert s["by_domain"] == {"arith": {"candidates": 24, "kept": 6}}
    rows, report = read_conversations(out)  # the output is valid SFT data
    assert report.kept == 6 and s["rows_in_output"] == 6
    for r in rows:
        prov = r["provenance"]
        assert prov["teacher"] == "teacher-a" and prov["sampling"] == {"temperature": 0.8, "n": 8}
        assert prov["reward"] == 1.0 and prov["verify_reason"] == "correct" and prov["finish_reason"] == "stop"
        assert prov["prompt_rows"] == 2 and prov["prompt_messages"] == 1 and prov["round"] == 0
        assert r["task_id"] == r["prompt_id"] and r["domain"] == "arith"
        last = r["messages"][-1]  # reasoning parsed out of the raw text
        assert last["content"].startswith("Answer: ") and last["reasoning_content"].startswith("w")
    assert [len([r for r in rows if r["prompt_id"] == f"t{i}"]) for i in range(3)] == [2, 2, 2]
    saved = json.loads(summary_path(out).read_text())
    assert saved["kept"] == 6 and saved["history"] == []


def test_every_candidate_is_counted_once_and_k_bounds_each_prompt(tmp_path):
    for k in (1, 3, 5):
        out = tmp_path / f"k{k}.jsonl"
        s = curate(make_tasks(2), StandIn(variants=(1, 2, 3, 4)), verify, CurateConfig(out=out, k=k), log=quiet)
        assert s["candidates"] == s["kept"] + sum(s["dropped"].values())
        assert s["kept"] == 2 * min(k, 4)


def test_global_near_duplicates_across_prompts_are_dropped(tmp_path):
    tasks = make_tasks(2)
    twin = Task(id="t0-copy", domain="arith", messages=tasks[0].messages, ground_truth=tasks[0].ground_truth)
    gen = StandIn(key=lambda t: t.messages[0]["content"], bad=False, near_dup_of=None, variants=(1, 2))
    s = curate([tasks[0], twin, tasks[1]], gen, verify, CurateConfig(out=tmp_path / "o.jsonl", k=2), log=quiet)
    assert s["dropped"] == {"near_duplicate_global": 2}
    assert {r["prompt_id"] for r in rows_of(tmp_path / "o.jsonl")} == {"t0", "t1"}


def test_reasoning_transforms_are_applied_per_prompt_and_reproducibly(tmp_path):
    cfg = CurateConfig(out=tmp_path / "off.jsonl", k=2, reasoning_off_frac=1.0)
    s = curate(make_tasks(2), StandIn(), verify, cfg, log=quiet)
    rows = rows_of(tmp_path / "off.jsonl")
    assert s["transforms"] == {"reasoning_off": 4}
    assert all(r["reasoning"] is False and "/no_think" in r["messages"][0]["content"]
               and "reasoning_content" not in r["messages"][-1] for r in rows)
    for name in ("b1", "b2"):
        curate(make_tasks(2), StandIn(), verify,
               CurateConfig(out=tmp_path / f"{name}.jsonl", k=2, budget_frac=0.5, seed=3), log=quiet)
    assert rows_of(tmp_path / "b1.jsonl") == rows_of(tmp_path / "b2.jsonl")
    assert any(r.get("budget_truncated") for r in rows_of(tmp_path / "b1.jsonl"))


# --------------------------------------------------------------------------- resume


def test_resume_after_a_kill_skips_done_prompts_and_matches_a_clean_run(tmp_path):
    clean = tmp_path / "clean.jsonl"
    curate(make_tasks(5), StandIn(), verify, CurateConfig(out=clean, k=2, batch_prompts=2), log=quiet)
    out = tmp_path / "killed.jsonl"
    with pytest.raises(RuntimeError, match="killed"):
        curate(make_tasks(5), StandIn(fail_on_call=2), verify, CurateConfig(out=out, k=2, batch_prompts=2), log=quiet)
    assert {r["prompt_id"] for r in rows_of(out)} == {"t0", "t1"}
    with pytest.raises(CurateError, match="--resume"):
        curate(make_tasks(5), StandIn(), verify, CurateConfig(out=out, k=2), log=quiet)
    gen = StandIn()
    s = curate(make_tasks(5), gen, verify, CurateConfig(out=out, k=2, batch_prompts=2, resume=True), log=quiet)
    assert gen.calls == [["t2", "t3"], ["t4"]]
    assert s["prompts_skipped_done"] == 2 and s["mode"] == "resume"
    assert rows_of(out) == rows_of(clean)
    assert len(json.loads(summary_path(out).read_text())["history"]) == 0  # the killed run saved none


def test_a_torn_tail_is_removed_and_its_prompt_redone(tmp_path):
    clean = tmp_path / "clean.jsonl"
    curate(make_tasks(2), StandIn(), verify, CurateConfig(out=clean, k=2), log=quiet)
    out = tmp_path / "torn.jsonl"
    lines = clean.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + lines[1] + lines[2] + lines[3][:40])  # t1's block cut mid-row
    done_path(out).write_text('"t0"\n"t1"\n')
    rows, done = load_output(out)
    assert done == {"t0"} and [r["prompt_id"] for r in rows] == ["t0", "t0"]
    gen = StandIn()
    curate(make_tasks(2), gen, verify, CurateConfig(out=out, k=2, resume=True), log=quiet)
    assert gen.calls == [["t1"]]
    assert rows_of(out) == rows_of(clean)


def test_prompts_with_nothing_kept_are_not_generated_again(tmp_path):
    out = tmp_path / "o.jsonl"
    gen = StandIn(variants=(), near_dup_of=None)  # only bad candidates
    curate(make_tasks(2), gen, verify, CurateConfig(out=out, k=2), log=quiet)
    assert not out.exists() or rows_of(out) == []
    gen2 = StandIn()
    s = curate(make_tasks(3), gen2, verify, CurateConfig(out=out, k=2, resume=True), log=quiet)
    assert gen2.calls == [["t2"]] and s["prompts_skipped_done"] == 2


def test_a_corrupt_line_in_the_middle_is_an_error_not_a_repair(tmp_path):
    out = tmp_path / "o.jsonl"
    curate(make_tasks(2), StandIn(), verify, CurateConfig(out=out, k=2), log=quiet)
    lines = out.read_bytes().splitlines(keepends=True)
    for bad, problem in [(b"not json\n", "not valid JSON"), (lines[1][:50] + b"\xe9" + lines[1][50:], "not UTF-8")]:
        before = b"".join([lines[0], bad, *lines[2:]])
        out.write_bytes(before)
        with pytest.raises(CurateError, match=f"o.jsonl:2: {problem}.*corrupt"):
            load_output(out)
        assert out.read_bytes() == before


def test_resume_refuses_a_file_curate_did_not_write_and_leaves_it_untouched(tmp_path, monkeypatch, capsys):
    """Issue 12 item 15: before, a plain JSONL file was taken for a torn output, rewritten (its last
    line dropped), and the run then crashed on a missing field."""
    from posttrain.cli import main

    out = tmp_path / "plain.jsonl"
    conversation = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    plain = [
        (json.dumps(conversation) + "\n") * 2 + "a last line that is not JSON\n",  # the old code truncated this
        (json.dumps(conversation) + "\n") * 3,  # this it kept, then crashed on r["id"]
        '{"id": "t0", "prompt_id": "t0", "messages": []}\n',  # curate-like, without curate's provenance
        "[1, 2, 3]\n",
        "just some notes\n",
    ]
    for text in plain:
        out.write_text(text)
        for mode in ({"resume": True}, {"refresh": True}):
            with pytest.raises(CurateError, match="plain.jsonl:1: .*is not curate output.*nothing was changed"):
                curate(make_tasks(2), StandIn(), verify, CurateConfig(out=out, k=2, **mode), log=quiet)
            assert out.read_text() == text and not done_path(out).exists() and not refresh_path(out).exists()
    # through the CLI: one line, exit 2, before any teacher is loaded
    monkeypatch.setattr("posttrain.envs.base.make_env", lambda name, **kw: EchoEnv())
    monkeypatch.setattr(curate_command, "make_teacher", lambda spec: pytest.fail("a teacher was loaded"))
    out.write_text(plain[0])
    assert main(["curate", "--env", "echo", "--teacher", "x", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "is not curate output" in err and "\n" not in err
    assert out.read_text() == plain[0] and not summary_path(out).exists()


def test_a_kill_that_cuts_a_multibyte_character_or_a_done_id_is_repaired(tmp_path):
    clean = tmp_path / "clean.jsonl"
    tasks = make_tasks(2)
    for t in tasks:  # non-ASCII text, written as UTF-8 (ensure_ascii=False)
        t.messages[0]["content"] += " — réponse «ici»"
    curate(tasks, StandIn(), verify, CurateConfig(out=clean, k=2), log=quiet)
    data = clean.read_bytes()
    cut = data.rindex("—".encode()) + 1  # inside the last row's 3-byte dash
    out = tmp_path / "torn.jsonl"
    out.write_bytes(data[:cut])
    done_path(out).write_text('"t0"\n"t')  # its .done line cut too
    rows, done = load_output(out)
    assert done == {"t0"} and [r["prompt_id"] for r in rows] == ["t0", "t0"]
    assert done_path(out).read_text() == '"t0"\n'
    gen = StandIn()
    curate(tasks, gen, verify, CurateConfig(out=out, k=2, resume=True), log=quiet)
    assert gen.calls == [["t1"]] and out.read_bytes() == data


# --------------------------------------------------------------------------- refresh


def test_refresh_merges_a_new_teacher_pool_under_k_and_dedup(tmp_path):
    out = tmp_path / "sft.jsonl"
    curate(make_tasks(4), StandIn(teacher="old", variants=(1, 2), near_dup_of=None, bad=False), verify,
           CurateConfig(out=out, k=2), log=quiet)
    old_rows = rows_of(out)
    new = StandIn(teacher="new", variants=(3, 4), near_dup_of=1, bad=False)  # one near-copy of an old row
    s = curate(make_tasks(3), new, verify, CurateConfig(out=out, k=2, refresh=True), log=quiet)
    rows = rows_of(out)
    assert s["mode"] == "refresh" and s["round"] == 1 and s["carried_over"] == 8
    for pid in ("t0", "t1", "t2"):
        mine = [r for r in rows if r["prompt_id"] == pid]
        assert len(mine) == 2 and {r["provenance"]["teacher"] for r in mine} == {"new"}
        assert all(r["provenance"]["round"] == 1 for r in mine)
    assert [r for r in rows if r["prompt_id"] == "t3"] == [r for r in old_rows if r["prompt_id"] == "t3"]
    # per refreshed prompt: the near-copy beats the old original, K drops the rest
    assert s["dropped"] == {"over_k": 3 * 2, "near_duplicate": 3}
    assert s["candidates"] == s["kept"] + sum(s["dropped"].values()) == 3 * 3 + 8
    assert not refresh_path(out).exists()
    assert set(json.loads(x) for x in done_path(out).read_text().split()) == {"t0", "t1", "t2", "t3"}
    assert len(json.loads(summary_path(out).read_text())["history"]) == 1


def test_refresh_needs_an_output_and_excludes_resume(tmp_path):
    with pytest.raises(CurateError, match="existing output"):
        curate(make_tasks(1), StandIn(), verify, CurateConfig(out=tmp_path / "none.jsonl", refresh=True), log=quiet)
    with pytest.raises(ValueError, match="exclusive"):
        CurateConfig(out=tmp_path / "x.jsonl", refresh=True, resume=True)


# --------------------------------------------------------------------------- prompts


def test_prompt_rows_become_tasks_and_bad_rows_name_their_line(tmp_path):
    t = as_task({"id": 7, "messages": [{"role": "user", "content": "hi"}], "env": "instruction"})
    assert t.id == "7" and t.domain == "instruction" and t.metadata["env"] == "instruction"
    p = tmp_path / "prompts.jsonl"
    p.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n{"messages": []}\n')
    with pytest.raises(CurateError, match="prompts.jsonl:2: missing field 'id'"):
        read_prompts(p)
    with pytest.raises(CurateError, match="duplicate prompt id"):
        curate([make_tasks(1)[0], make_tasks(1)[0]], StandIn(), verify, CurateConfig(out=tmp_path / "d.jsonl"), log=quiet)


# --------------------------------------------------------------------------- teacher pool


class FakeGenerator:
    """Replies from a function of the conversation; records calls."""

    def __init__(self, reply, finish="stop"):
        self.reply, self.finish = reply, finish
        self.calls: list[tuple[int, SamplingParams, list]] = []

    def generate(self, prompts, params, tools=None):
        self.calls.append((len(prompts), params, list(tools or [])))
        return [[Completion(self.reply(p, j), finish_reason=self.finish) for j in range(params.n)] for p in prompts]


def test_teacher_pool_splits_n_round_robin_and_records_provenance():
    a = FakeGenerator(lambda p, j: f"a{j}")
    b = FakeGenerator(lambda p, j: f"b{j}", finish="length")
    pool = GeneratingTeacherPool([("A", a), ("B", b)], n=3, params=SamplingParams(temperature=0.7, seed=1))
    assert pool.shares() == [2, 1]
    tasks = make_tasks(2)
    cands = pool(tasks)
    assert [[c.teacher for c in cs] for cs in cands] == [["A", "A", "B"]] * 2
    assert [c.messages[0]["content"] for c in cands[0]] == ["a0", "a1", "b0"]
    assert cands[0][0].sampling["n"] == 2 and cands[0][2].sampling["n"] == 1
    assert cands[0][0].sampling["temperature"] == 0.7 and cands[0][2].finish_reason == "length"
    assert a.calls[0][0] == 2 and a.calls[0][2] == [None, None]  # one call per teacher for the chunk
    with pytest.raises(CurateError):
        GeneratingTeacherPool([], n=2, params=SamplingParams())


def test_teacher_pool_seeds_each_prompt_by_task_id_not_by_its_place_in_the_batch():
    """Issue 12 item 11: a resumed run batches the remaining prompts differently; a prompt's samples
    must not change with that (they did: 19 rows instead of 18 after kills)."""

    class Seeded(FakeGenerator):
        def generate(self, prompts, params, tools=None, seeds=None):
            self.calls.append((len(prompts), params, list(seeds)))
            return [[Completion(f"{s}.{j}") for j in range(params.n)] for s in seeds]

    def texts(pool, tasks):
        return {t.id: [c.messages[0]["content"] for c in cs] for t, cs in zip(tasks, pool(tasks))}

    a, b = Seeded(None), Seeded(None)
    pool = GeneratingTeacherPool([("A", a), ("B", b)], n=3, params=SamplingParams(seed=7))
    tasks = make_tasks(4)
    whole = texts(pool, tasks)
    assert texts(pool, tasks[2:]) == {k: whole[k] for k in ("t2", "t3")}
    assert texts(pool, tasks[::-1]) == whole
    assert len({*a.calls[0][2], *b.calls[0][2]}) == 8  # per teacher and task: two teachers sample apart
    other = GeneratingTeacherPool([("A", Seeded(None))], n=2, params=SamplingParams(seed=8))
    assert texts(other, tasks[:1]) != {"t0": whole["t0"][:2]}  # and the run's seed still matters


def test_a_local_teacher_samples_a_prompt_the_same_in_any_batch(one_thread):
    from posttrain.engines.hf import HFGenerator

    gen = HFGenerator.from_spec("tiny-llama")
    pool = GeneratingTeacherPool([("tiny", gen)], n=2, params=SamplingParams(max_new_tokens=6, temperature=1.0, seed=3))
    tasks = make_tasks(3)
    whole = [[c.messages[0]["content"] for c in cs] for cs in pool(tasks)]
    alone = [[c.messages[0]["content"] for c in cs] for cs in pool(tasks[2:])]
    assert whole[2] == alone[0] and whole[2][0] != whole[2][1]


class ToolEnv(Environment):
    name = "_curate_test_tools"
    domain = "tools"
    multi_turn = True

    def __init__(self, turns_to_done: int | None = 2):
        self.turns_to_done = turns_to_done

    def start_episode(self, task):
        env = self

        class Ep(Episode):
            turns = 0

            def step(self, msg):
                self.turns += 1
                if env.turns_to_done is not None and self.turns >= env.turns_to_done:
                    return StepResult([{"role": "user", "content": "thanks, bye"}], True)
                return StepResult([{"role": "tool", "content": '{"result": 4}'}], False)

        return Ep(task)


def test_teacher_pool_rolls_out_tool_episodes_turn_by_turn():
    def reply(conv, j):
        return "Answer: 4" if conv[-1]["role"] == "tool" else format_tool_call("calc", {"expr": "2+2"})

    gen = FakeGenerator(reply)
    pool = GeneratingTeacherPool([("T", gen)], n=2, params=SamplingParams(seed=5), env=ToolEnv())
    cands = pool(make_tasks(1))[0]
    assert len(cands) == 2 and gen.calls[0][0] == 2  # both episodes advance in one batched call
    roles = [m["role"] for m in cands[0].messages]
    assert roles == ["assistant", "tool", "assistant"]  # the user's closing line is not a trained turn
    assert cands[0].messages[-1]["content"] == "Answer: 4" and cands[0].finish_reason == "stop"
    assert len(gen.calls) == 2 and all(c[1].n == 1 for c in gen.calls)  # one sample per episode per turn
    endless = GeneratingTeacherPool([("T", FakeGenerator(reply))], n=1, params=SamplingParams(), env=ToolEnv(None),
                                    max_turns=3)
    assert endless(make_tasks(1))[0][0].finish_reason == "max_turns"


# --------------------------------------------------------------------------- CLI


class EchoEnv(Environment):
    name = "_curate_test_echo"
    domain = "arith"

    def tasks(self, split="train", n=None, seed=0):
        return make_tasks(n or 3)

    def verify(self, task, messages):
        return verify(task, messages)


def test_cli_runs_the_pipeline_with_env_tasks_and_filter_options(tmp_path, monkeypatch):
    class PoolGen:
        def __init__(self, name):
            self.name = name

        def generate(self, prompts, params, tools=None):
            out = []
            for p in prompts:
                gt = str(2 * int(p[0]["content"].split()[2]))
                out.append([Completion(f"<think>\n{explanation(p[0]['content'] + self.name + str(j))}"
                                       + (" forbiddenword" if (self.name, j) == ("y", 0) else "")
                                       + f"\n</think>\nAnswer: {gt}") for j in range(params.n)])
            return out

    monkeypatch.setattr(curate_command, "make_teacher", lambda spec: (spec, PoolGen(spec)))
    monkeypatch.setattr("posttrain.envs.base.make_env", lambda name, **kw: EchoEnv())
    parser = argparse.ArgumentParser()
    curate_command.add_arguments(parser)
    out = tmp_path / "cli.jsonl"
    args = parser.parse_args(["--env", "echo", "--teacher", "x", "--teacher", "y", "--n", "4", "--k", "3",
                              "--limit", "3", "--out", str(out), "--filter-option", "length.max_words=500",
                              "--block-pattern", "forbidden=forbiddenword"])
    assert curate_command.run(args) == 0
    s = json.loads(summary_path(out).read_text())
    assert s["prompts_processed"] == 3 and s["kept"] == 9 and s["dropped"] == {"filter:keywords:forbidden": 3}
    assert set(s["by_teacher"]) == {"x", "y"} and s["config"]["filters"]["options"]["length"] == {"max_words": 500}
    bad = parser.parse_args(["--env", "echo", "--teacher", "x", "--out", str(tmp_path / "b.jsonl"),
                             "--filter-option", "nonsense"])
    with pytest.raises(CurateError, match="FILTER.FIELD=VALUE"):
        curate_command.run(bad)
    unknown = parser.parse_args(["--env", "echo", "--teacher", "x", "--out", str(tmp_path / "u.jsonl"),
                                 "--filter-option", "lenght.max_words=5"])
    monkeypatch.setattr(curate_command, "make_teacher", lambda spec: pytest.fail("a teacher was loaded"))
    with pytest.raises(CurateError, match="unknown filter 'lenght'"):  # refused before any teacher loads
        curate_command.run(unknown)


def test_a_server_teacher_is_asked_for_text_only():
    from posttrain.data.curate import make_teacher

    name, gen = make_teacher("big=http://127.0.0.1:9/v1#judge")  # no request is made here
    assert name == "big" and gen.model == "judge" and gen.logprobs is False
