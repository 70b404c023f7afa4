"""Preference pairs whose better side is visible without solving the task (issue 35, item 1).

Why: a judge trained on "a right sum against a wrong sum" must do the sum to tell them apart; the
embedded 135M model gets about 15% of those sums right, and its GenRM converged on one fixed verdict
(docs/results/genrm.md). Each pair here differs in something a reader sees on the page: a rule the
prompt states and the reply breaks, a reply that stops mid-word, a reply about another request, a
tool call where no tool fits, an answer whose format is broken.

**Kinds** (``KINDS``), each built from a task of a verifiable environment and its known-good reply:

* ``constraint`` — the instruction environment's scripted reference reply (passes every rule) vs the
  same reply edited to break at least one stated rule (its last or first line dropped, the text
  doubled, its case changed, its markup stripped: the first edit, in a seeded order, that the
  verifier rejects). Edits both lengthen and shorten, so "longer wins" is no shortcut.
* ``truncated`` — the reference reply vs the same reply cut off mid-word at 30–60% of its length
  (instruction and arithmetic tasks).
* ``off_topic`` — the reference reply vs the reference reply of another task (another topic, or
  another sum).
* ``tool_unfit`` — a worked arithmetic answer vs a ``web_search`` tool call carrying the question:
  no tool is needed or offered.
* ``malformed`` — a worked arithmetic answer with ``Answer: N`` vs the same reply whose answer line is
  broken (``Answer: \\boxed{N`` or ``Answer: (N``): the right number, in a form the grader refuses.

**Ground truth, one rule for every kind.** Both replies are graded by the task's own verifier;
helpfulness = 1 + round(4·q), where q is the share of the verifier's checks that hold (instruction:
each constraint and the substance check; arithmetic: the reward, 0 or 1); the ranking follows from
the two scores (``algos.genrm.rank_from_scores``). A pair is kept only when the good reply scores
5 and the other strictly less: the verifier, not the edit, decides the label.

**Splits.** A pair is built from a task of one split of its environment and lands in that split:
held-out (dev, test) pairs come from held-out prompts only.

**Shortcut baselines** (``shortcut_accuracy``): the ranking-side accuracy of "the longer reply wins"
and of "the shorter reply wins" per kind, printed beside a judge's figures so a judge that learned
length alone is seen as such.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from posttrain.algos.genrm import Judgement, rank_from_scores, score_from_reward
from posttrain.envs.base import Message, Task, make_env
from posttrain.envs.genrm.format import response_text
from posttrain.envs.genrm.pairs import PreferencePair, pair_id
from posttrain.envs.splits import Split, check_split

KINDS = ("constraint", "truncated", "off_topic", "tool_unfit", "malformed")
INSTRUCTION_ARGS = {"min_constraints": 1, "max_constraints": 3}  # rules a 135M judge can read in one prompt


def _assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def _quality(env: Any, task: Task, reply: Message) -> float:
    """q of the module docstring: the share of the verifier's checks that hold."""
    res = env.verify(task, [reply])
    comps = [v for v in res.components.values() if v in (0.0, 1.0)] if env.name == "instruction" else []
    return sum(comps) / len(comps) if comps else float(res.reward)


def _pair(env: Any, task: Task, good: Message, bad: Message, kind: str, detail: str) -> PreferencePair | None:
    """The labelled pair, or None when the verifier does not separate the two replies."""
    qg, qb = _quality(env, task, good), _quality(env, task, bad)
    h1, h2 = score_from_reward(qg), score_from_reward(qb)
    rank = rank_from_scores(h1, h2)
    if h1 != 5 or h2 >= h1 or rank is None:
        return None
    msgs = list(task.messages)
    return PreferencePair(pair_id(msgs, good, bad), msgs, good, bad, Judgement(h1, h2, rank), f"visible/{kind}",
                          {"task_id": task.id, "kind": kind, "detail": detail, "q_bad": qb,
                           "failed": env.verify(task, [bad]).reason})


# --------------------------------------------------------------------------- edits (pure)

def drop_last_line(text: str) -> str:
    lines = [ln for ln in text.strip().split("\n")]
    return "\n".join(lines[:-1]).strip() if len(lines) > 1 else text[: len(text) // 2]


def drop_first_line(text: str) -> str:
    lines = text.strip().split("\n")
    return "\n".join(lines[1:]).strip() if len(lines) > 1 else text[len(text) // 2:]


def doubled(text: str) -> str:
    return text.strip() + "\n\n" + text.strip()


def strip_markup(text: str) -> str:
    out = text
    for ch in ("*", "<<", ">>", "[", "]", "#", '"'):
        out = out.replace(ch, "")
    return "\n".join(ln.lstrip("-• ").rstrip() for ln in out.split("\n"))


def cut_mid_word(text: str, rng: random.Random) -> str:
    """``text`` cut at 30–60% of its characters, inside a word where there is one (no final stop)."""
    n = len(text)
    at = max(1, int(n * rng.uniform(0.3, 0.6)))
    while at < n - 1 and not text[at - 1].isalnum():
        at += 1
    return text[:at].rstrip()


EDITS: dict[str, Callable[[str], str]] = {
    "drop_last_line": drop_last_line, "drop_first_line": drop_first_line, "doubled": doubled,
    "upper": str.upper, "lower": str.lower, "strip_markup": strip_markup,
}


# --------------------------------------------------------------------------- the kinds

def _instruction_tasks(split: Split, n: int, seed: int) -> tuple[Any, list[Task]]:
    env = make_env("instruction", **INSTRUCTION_ARGS)
    return env, env.tasks(split, n, seed=seed)


def _arithmetic_tasks(split: Split, n: int, seed: int) -> tuple[Any, list[Task]]:
    env = make_env("arithmetic")
    return env, env.tasks(split, n, seed=seed)


def arithmetic_reply(task: Task) -> Message:
    """A short worked answer in the format the prompt asks for (``Answer: N``)."""
    question = task.messages[-1]["content"].split("?")[0].removeprefix("What is ").strip()
    return _assistant(f"{question} = {task.ground_truth}.\n\nAnswer: {task.ground_truth}")


def constraint_pairs(split: Split, n: int, seed: int = 0) -> list[PreferencePair]:
    env, tasks = _instruction_tasks(split, n, seed)
    rng, out = random.Random(seed), []
    for t in tasks:
        ref = t.metadata["reference_response"]
        for name in rng.sample(sorted(EDITS), len(EDITS)):
            edited = EDITS[name](ref)
            p = _pair(env, t, _assistant(ref), _assistant(edited), "constraint", name) if edited != ref else None
            if p is not None:
                out.append(p)
                break
    return out


def truncated_pairs(split: Split, n: int, seed: int = 0) -> list[PreferencePair]:
    rng, out = random.Random(seed + 1), []
    ienv, itasks = _instruction_tasks(split, (n + 1) // 2, seed + 1)
    aenv, atasks = _arithmetic_tasks(split, n // 2, seed + 1)
    for env, t, good in [(ienv, t, _assistant(t.metadata["reference_response"])) for t in itasks] + \
                        [(aenv, t, arithmetic_reply(t)) for t in atasks]:
        p = _pair(env, t, good, _assistant(cut_mid_word(good["content"], rng)), "truncated", "cut")
        if p is not None:
            out.append(p)
    return out


def off_topic_pairs(split: Split, n: int, seed: int = 0) -> list[PreferencePair]:
    out = []
    ienv, itasks = _instruction_tasks(split, (n + 1) // 2, seed + 2)
    aenv, atasks = _arithmetic_tasks(split, n // 2, seed + 2)
    for env, tasks, reply in ((ienv, itasks, lambda t: _assistant(t.metadata["reference_response"])),
                              (aenv, atasks, arithmetic_reply)):
        for i, t in enumerate(tasks):  # the next task's reply (a ring): every reply is used once as the stray one
            other = tasks[(i + 1) % len(tasks)]
            if other.metadata.get("topic") == t.metadata.get("topic") and env.name == "instruction":
                continue
            p = _pair(env, t, reply(t), reply(other), "off_topic", other.id) if len(tasks) > 1 else None
            if p is not None:
                out.append(p)
    return out


def tool_unfit_pairs(split: Split, n: int, seed: int = 0) -> list[PreferencePair]:
    env, tasks = _arithmetic_tasks(split, n, seed + 3)
    out = []
    for t in tasks:
        call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "web_search", "arguments": {"query": t.messages[-1]["content"].split("?")[0] + "?"}}}]}
        p = _pair(env, t, arithmetic_reply(t), call, "tool_unfit", "web_search")
        if p is not None:
            out.append(p)
    return out


def malformed_pairs(split: Split, n: int, seed: int = 0) -> list[PreferencePair]:
    env, tasks = _arithmetic_tasks(split, n, seed + 4)
    rng, out = random.Random(seed + 4), []
    for t in tasks:
        good = arithmetic_reply(t)
        form = rng.choice(("Answer: \\boxed{%s", "Answer: (%s"))
        bad = _assistant(good["content"].replace(f"Answer: {t.ground_truth}", form % t.ground_truth))
        p = _pair(env, t, good, bad, "malformed", form.split(" ")[1][:2])
        if p is not None:
            out.append(p)
    return out


BUILDERS: dict[str, Callable[[Split, int, int], list[PreferencePair]]] = {
    "constraint": constraint_pairs, "truncated": truncated_pairs, "off_topic": off_topic_pairs,
    "tool_unfit": tool_unfit_pairs, "malformed": malformed_pairs,
}


def visible_pairs(split: Split, n_per_kind: int, kinds: Sequence[str] = KINDS, seed: int = 0) -> list[PreferencePair]:
    """Up to ``n_per_kind`` pairs of each kind from ``split``'s tasks (fewer where the verifier
    does not separate an edit), kind after kind."""
    check_split(split)
    unknown = [k for k in kinds if k not in BUILDERS]
    if unknown:
        raise ValueError(f"unknown visible pair kind(s) {unknown}; known: {', '.join(KINDS)}")
    return [p for k in kinds for p in BUILDERS[k](split, n_per_kind, seed)]


CUES: dict[str, str] = {  # the defect of the worse reply, as a reader of the page would name it
    "constraint": "One reply breaks a rule the user stated ({why})",
    "truncated": "One reply stops mid-sentence",
    "off_topic": "One reply is about another request",
    "tool_unfit": "One reply calls a tool where none is needed",
    "malformed": "One reply's answer line is malformed",
}


def cue_reasoning(pair: PreferencePair, swapped: bool) -> str | None:
    """A one-line rationale naming the visible defect first and then the response that has it, or
    None for a pair that is not a visible pair (no ``kind``). Why the defect comes first: the judge
    then classifies what is wrong before it names a side, and the verdict lines follow from the
    side it named. The constraint cue quotes the verifier's own reason (``failed: word_count (30
    words, needs at least 50 words)`` → ``30 words, needs at least 50 words``)."""
    kind = pair.metadata.get("kind")
    if kind not in CUES:
        return None
    failed = str(pair.metadata.get("failed", ""))
    why = failed[failed.find("(") + 1: failed.rfind(")")] if "(" in failed and failed.endswith(")") else failed
    bad, good = (1, 2) if swapped else (2, 1)  # as built, response 1 is the better reply
    return f"{CUES[kind].format(why=why.strip() or 'a stated rule')}: response {bad}. Response {good} does what was asked."


def shortcut_accuracy(pairs: Sequence[PreferencePair]) -> dict[str, float]:
    """Ranking-side accuracy of the "longer reply wins" and "shorter reply wins" judges, overall and
    per kind (a tie counts as wrong). Response 1 is the better reply in every pair as built."""
    out: dict[str, float] = {}
    groups: dict[str, list[PreferencePair]] = {"all": list(pairs)}
    for p in pairs:
        groups.setdefault(p.metadata.get("kind", p.source), []).append(p)
    for name, ps in groups.items():
        if not ps:
            continue
        d = [len(response_text(p.response_1)) - len(response_text(p.response_2)) for p in ps]
        out[f"{name}/longer_wins"] = sum(x > 0 for x in d) / len(ps)
        out[f"{name}/shorter_wins"] = sum(x < 0 for x in d) / len(ps)
    return out
