"""The RL-vs-control evidence (experiments/evidence.py): the controls' budgets and the test table,
pure functions on records written here."""

from __future__ import annotations

import json

import pytest

from posttrain.experiments import evidence


def _records(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"env": env, "task_id": tid, "reward": r, "reason": "x"}) + "\n"
                            for env, tasks in rows.items() for tid, r in tasks.items()))
    return {"records": str(path), "n_tasks": 4}


def test_rl_trained_tokens_counts_policy_gradient_and_anchor_tokens(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "tokens_in_batch": 100.0, "anchor_tokens": 40.0, "loss": 0.1},
        {"step": 2, "tokens_in_batch": 60.0, "loss": 0.1},  # a step without the anchor
        {"step": 2, "val_reward": 0.5},  # a validation row trains nothing
    ]))
    assert evidence.rl_trained_tokens(tmp_path) == 200
    assert evidence.rl_trained_tokens(tmp_path / "missing") == 0


def test_tokens_budget_matches_the_sft_stage_tokens_per_step():
    sft = {"tokens_trained": 1000, "steps": 10}  # 100 target tokens a step
    assert evidence.tokens_budget(sft, 450) == 4 and evidence.tokens_budget(sft, 460) == 5
    assert evidence.tokens_budget(sft, 0) == 1  # an RL stage that trained nothing still gets a control step
    assert evidence.tokens_budget({"tokens_trained": 0, "steps": 0}, 10) == 10  # no pace: one token a step at worst


def test_table_pairs_rl_with_each_control_per_domain_wording_and_pooled(tmp_path):
    ids = ["arith-1+2", "arith-story-3+4", "arith-words-5-6", "arith-7*8"]
    sft = _records(tmp_path / "sft.jsonl", {"arithmetic": dict(zip(ids, [1, 0, 0, 0])), "mcq": {"m0": 0, "m1": 1}})
    rl = _records(tmp_path / "rl.jsonl", {"arithmetic": dict(zip(ids, [1, 1, 1, 0])), "mcq": {"m0": 0, "m1": 1}})
    arm = _records(tmp_path / "arm.jsonl", {"arithmetic": dict(zip(ids, [1, 0, 0, 1])), "mcq": {"m0": 1, "m1": 1}})
    t = evidence.table({"sft": sft, "rl": rl, "sft_arm": arm})
    assert set(t["comparisons"]) == {"RL − SFT", "RL − SFT same time", "SFT same time − SFT"}
    vs = t["comparisons"]["RL − SFT same time"]
    assert vs["arithmetic"]["gain"] == pytest.approx(0.25) and vs["mcq"]["gain"] == -0.5
    assert vs["all"]["n"] == 6 and vs["all"]["gain"] == pytest.approx(0.0)  # +1 arithmetic task, -1 mcq task
    assert vs["arithmetic · story"]["gain"] == 1.0 and vs["arithmetic · plain"]["n"] == 2
    assert t["scores"]["rl"]["arithmetic"] == 0.75 and t["scores"]["sft_arm"]["mcq"] == 1.0
    assert evidence.headline(t)["gain"] == pytest.approx(0.0)
    text = "\n".join(evidence.lines(t))
    assert "RL − SFT same time (paired per task" in text and "SFT same time − SFT (paired" not in text
    assert "arithmetic · story" in text and "SFT + RL" in text


def test_a_control_missing_from_the_run_leaves_its_comparisons_out(tmp_path):
    sft = _records(tmp_path / "sft.jsonl", {"arithmetic": {"arith-1+2": 0}})
    rl = _records(tmp_path / "rl.jsonl", {"arithmetic": {"arith-1+2": 1}})
    t = evidence.table({"sft": sft, "rl": rl})
    assert list(t["comparisons"]) == ["RL − SFT"] and evidence.headline(t) is None  # no control: no headline
    assert evidence.headline(t, "RL − SFT")["gain"] == 1.0  # one domain: its figure is the pooled one


def test_external_grades_read_the_answers_again_with_ifevals_checkers():
    """A reply that keeps its constraints passes both graders; an empty one fails both; a task whose
    constraints IFEval has no checker for is left out rather than counted as a pass."""
    from posttrain.envs.instruction.env import InstructionEnv

    tasks = InstructionEnv(1, 2).tasks("test", 12, seed=0)
    rows = [{"env": "instruction", "task_id": t.id, "answer": a} for t in tasks
            for a in (t.metadata["reference_response"], "")]
    graded = evidence.external_grades(rows, {t.id: t for t in tasks})
    assert graded and len(graded) % 2 == 0  # both answers of a task, or neither
    good, empty = graded[0::2], graded[1::2]
    assert sum(g["reward"] for g in good) >= len(good) - 1  # the scripted replies pass (IFEval may differ on one)
    assert all(g["ours"] == 1.0 for g in good)
    assert all(g["reward"] == 0.0 and g["ours"] == 0.0 and g["reason"].startswith("ifeval: ") for g in empty)


def test_the_external_part_of_the_table_pairs_the_same_checkpoints(tmp_path):
    def ext(name, rewards, ours):
        path = tmp_path / f"{name}.ifeval.jsonl"
        path.write_text("".join(json.dumps({"env": "instruction", "task_id": f"t{i}", "reward": r, "ours": o, "reason": ""})
                                + "\n" for i, (r, o) in enumerate(zip(rewards, ours))))
        return {"external": str(path), "n_tasks": 4}

    models = {"sft": ext("sft", [0, 0, 1, 0], [0, 0, 1, 0]), "rl": ext("rl", [1, 1, 1, 0], [1, 1, 1, 1])}
    cmp = evidence.comparisons(models, "external")
    assert cmp["RL − SFT"]["instruction"]["gain"] == pytest.approx(0.5)
    a = evidence.agreement(tmp_path / "rl.ifeval.jsonl")
    assert (a["same"], a["n"], a["ours_only"], a["reference_only"]) == (3, 4, 1, 0)


def test_math_verify_reads_whole_replies_with_its_own_extraction():
    """Math-Verify takes the answer by its own priorities, not ours: a right final answer passes, a
    wrong one fails with what it read, a reply without a number fails, and only arithmetic and math
    records (with a reference) are graded."""
    from posttrain.eval.benchmarks import mathverify

    assert mathverify.grade_reply("23 + 45 = 68.\nAnswer: 68", "68") == (True, "68")
    assert mathverify.grade_reply("So the answer is 123.", "1339") == (False, "123")
    assert mathverify.grade_reply("I cannot say.", "4") == (False, "")
    assert mathverify.grade_reply("The answer is 0.5", "1/2")[0]  # equivalence, not string equality
    rows = [{"env": "arithmetic", "task_id": "a1", "answer": "Answer: 7", "reward": 1.0},
            {"env": "math", "task_id": "m1", "answer": "x = 3, so the answer is 4", "reward": 0.0},
            {"env": "math", "task_id": "m2", "answer": "nothing", "reward": 0.0},
            {"env": "instruction", "task_id": "i1", "answer": "7", "reward": 1.0},  # not a numeric domain
            {"env": "math", "task_id": "m-no-gold", "answer": "7", "reward": 1.0}]
    graded = mathverify.regrade(rows, {"a1": "7", "m1": "4", "m2": "5", "i1": "7"})
    assert [(g["task_id"], g["reward"], g["ours"]) for g in graded] == [("a1", 1.0, 1.0), ("m1", 1.0, 0.0), ("m2", 0.0, 0.0)]
    assert graded[2]["reason"] == "math-verify found no answer"


def test_numeric_records_grade_the_scored_test_tasks_again(tmp_path):
    """``numeric_records`` finds the references of the very tasks ``score_records`` drew (the RL run's
    environment, split and task seed) and writes Math-Verify's verdicts beside the records."""
    import yaml

    from posttrain.envs.base import make_env

    args = {"max_digits": 2, "min_digits": 1, "phrasings": ["words", "story"]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"model": "embedded", "envs": [{"name": "arithmetic", "args": args, "task_seed": 3, "val_tasks": 4}]}))
    tasks = make_env("arithmetic", **args).tasks("test", 4, 3)
    records = tmp_path / "rl.jsonl"
    records.write_text("".join(json.dumps({"env": "arithmetic", "task_id": t.id, "reward": float(i < 2), "reason": "",
                                           "answer": f"The answer is {t.ground_truth}" if i < 3 else "no idea"}) + "\n"
                               for i, t in enumerate(tasks)))
    path = evidence.numeric_records(tmp_path, records, "test", 4)
    graded = [json.loads(x) for x in path.read_text().splitlines()]
    assert path.name == "rl.mathverify.jsonl"
    assert [g["reward"] for g in graded] == [1.0, 1.0, 1.0, 0.0] and [g["ours"] for g in graded] == [1.0, 1.0, 0.0, 0.0]
    assert evidence.agreement(path)["reference_only"] == 1


def test_a_checkpoint_no_better_than_one_constant_answer_is_flagged(tmp_path, monkeypatch):
    """GCD questions answered "1" every time: the constant earns the share of tasks whose reference
    is 1 (here 2 of 4), so a checkpoint that scores 0.5 that way is flagged and one above it is not."""
    refs = {"g1": "1", "g2": "1", "g3": "6", "g4": "4", "a1": "12", "a2": "7"}
    monkeypatch.setattr(evidence, "references", lambda rl_dir, split, n: refs)

    def records(name, answers, rewards):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"env": "math" if tid.startswith("g") else "arithmetic", "task_id": tid,
                                            "reward": r, "reason": "", "answer": a}) + "\n"
                                for tid, a, r in zip(refs, answers, rewards)))
        return {"records": str(path), "n_tasks": 4}

    lazy = records("rl", ["Answer: 1"] * 4 + ["Answer: 12", "Answer: 3"], [1, 1, 0, 0, 1, 0])
    skilled = records("sft", ["Answer: 1", "Answer: 1", "Answer: 6", "x = 2", "12", "Answer: 7"], [1, 1, 1, 0, 1, 1])
    out = evidence.constant_answers({"rl": lazy, "sft": skilled}, tmp_path, "test", 4)
    assert out["math"]["constant"] == {"answer": "1", "score": 0.5, "n": 4}
    assert out["math"]["models"]["rl"] == {"answer": "1", "share": 1.0, "score": 0.5, "flagged": True}
    assert out["math"]["models"]["sft"]["score"] == 0.75 and not out["math"]["models"]["sft"]["flagged"]
    assert out["arithmetic"]["constant"]["score"] == 0.5  # two tasks, two answers: either constant gets one
    assert not out["arithmetic"]["models"]["sft"]["flagged"]  # 2 of 2
    text = "\n".join(evidence.lines({"scores": {"rl": {"math": 0.5}}, "comparisons": {}, "n_tasks": 4,
                                     "constant_answer": out}))
    assert "one constant answer ('1') would score 0.500" in text and "flagged: no better than the constant" in text


def test_shortcut_answers_say_who_gives_them_and_score_only_the_tasks_no_shortcut_answers(tmp_path, monkeypatch):
    """Four LCM questions: (3, 4) is paid by the product, (4, 12) by the larger number, (4, 6) and
    (6, 10) by neither. RL answers with the larger number every time: it scores 1 of 4 and 0 beyond
    the shortcuts; the skilled checkpoint gets (4, 6) right, so RL − it beyond the shortcuts is −0.5."""
    from posttrain.envs.base import Task

    pairs = {"a": ((3, 4), "12"), "b": ((4, 12), "12"), "c": ((4, 6), "12"), "d": ((6, 10), "30")}
    tasks = {tid: Task(tid, "math", [{"role": "user", "content": f"LCM of these numbers: {x}, {y}\n\nAnswer: <answer>"}],
                       gold, metadata={"family": "lcm"}) for tid, ((x, y), gold) in pairs.items()}
    monkeypatch.setattr(evidence, "scored_tasks", lambda rl_dir, env, split, n: tasks)

    def records(name, answers, rewards):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"env": "math", "task_id": tid, "reward": r, "reason": "", "answer": a}) + "\n"
                                for tid, a, r in zip(pairs, answers, rewards)))
        return {"records": str(path), "n_tasks": 4}

    lazy = records("rl", ["Answer: 4", "Answer: 12", "Answer: 6", "Answer: 10"], [0, 1, 0, 0])
    skilled = records("sft_arm", ["Answer: 12", "Answer: 48", "Answer: 12", "Answer: 20"], [1, 0, 1, 0])
    out = evidence.shortcut_answers({"rl": lazy, "sft_arm": skilled}, tmp_path, "test", 4)["lcm"]
    assert out["pays"] == {"product": 0.25, "larger number": 0.25} and out["n_beyond"] == 2
    assert out["models"]["rl"] == {"n": 4, "score": 0.25, "gives": {"product": 0.0, "larger number": 1.0},
                                   "beyond": {"n": 2, "score": 0.0}}
    assert out["models"]["sft_arm"]["gives"] == {"product": 0.5, "larger number": 0.0}  # 12 = 3·4, 48 = 4·12
    assert out["models"]["sft_arm"]["beyond"] == {"n": 2, "score": 0.5}
    vs = out["beyond_comparisons"]["RL − SFT same time"]
    assert (vs["n"], vs["gain"], vs["lost"]) == (2, -0.5, 1)
    text = "\n".join(evidence.lines({"scores": {"rl": {"math": 0.25}}, "comparisons": {}, "n_tasks": 4,
                                     "shortcuts": {"lcm": out}}))
    assert "product 25%, larger number 25%; 2 tasks no shortcut answers" in text
    assert "product 0%, larger number 100%; 0.250; 0.000" in text and "beyond shortcuts -0.500" in text
    monkeypatch.setattr(evidence, "scored_tasks", lambda rl_dir, env, split, n: {})
    assert evidence.shortcut_answers({"rl": lazy}, tmp_path, "test", 4) == {}  # no math family with shortcuts
