"""Multi-turn instruction following, graded by an LLM judge (docs/recipe.md §2.5).

A task is a conversation that ends in a user turn. The first user turn makes a request (topic, kind
of text, audience, tone) with two verifiable rules; each later user turn changes the rules once, and
sometimes the topic too. The earlier assistant replies are written by the scripted writer
(``writer.py``), so each obeys the rules in force at its turn. The model writes the final reply.
2 or 3 user turns in all.

Rule changes are a registry (``CHANGES``), each a function drawing one edit of the rule set:
* ``add``     — one more rule, compatible with those in force;
* ``modify``  — same kind of rule, new parameters (a different word limit, another end phrase);
* ``replace`` — drop a rule for one that conflicts with it (all lowercase → all capitals), which is
  what makes earlier turns misleading if the model only copies its previous style;
* ``drop``    — forget a rule (at least one stays).
A change is kept only if the writer can satisfy the new rule set.

Reward. The judge (``posttrain.envs.judge``: conversation + rubric → ``SCORE: n/10``) reads the whole
conversation, the final reply and a rubric naming the latest request, the tone, the rules in force and
the rules no longer in force. Because a judge can be wrong, the rules in force are also checked by
the constraint registry and reported as components (one 0/1 per kind):

    reward = judge score   if every rule in force holds
           = 0             otherwise (the judge is then not asked: its answer could not change it)

so the judge can only grade *down* what the program verified (topic, kind of text, tone, coherence)
and never reward a reply that breaks a checkable rule. "Every rule" includes the substance rule
(``substance.py``: at least 20 words, a word of the latest request's topic, 5 distinct words not
taken from the user's turns, no 10-word run copied from them), so a judge is never asked about
"ok." or an echo of the request. ``components["judge"]`` is the judge's score
when it was asked.

The judge is given to the constructor as a judge object or a spec string for ``make_judge``, which
is built on first ``verify`` (listing tasks never loads a judge model).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Callable, Sequence

from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, Task, VerifyResult, final_answer_text
from posttrain.envs.instruction.common import Judge, LazyJudge, content_id, judge_score, sample_tasks
from posttrain.envs.instruction.constraints import (
    CONSTRAINTS, Constraint, compatible, conflicting, constraint_from_dict, sample_constraints,
)
from posttrain.envs.instruction.env import draw_satisfiable, grade_constraints, rules_text, user_text
from posttrain.envs.instruction.substance import check_substance, min_words, topic_words
from posttrain.envs.instruction.topics import TONES, Request, Topic, sample_request
from posttrain.envs.instruction.writer import write_response
from posttrain.envs.judge import build_judge_prompt
from posttrain.registry import Registry

MAX_CHANGE_TRIES = 20


@dataclass
class Change:
    op: str
    constraints: list[Constraint]  # the rules in force after the change
    instruction: str  # what the user says about it
    dropped: list[Constraint] = field(default_factory=list)


ChangeOp = Callable[[random.Random, list[Constraint], Topic], "Change | None"]
CHANGES: Registry[ChangeOp] = Registry("rule change")


@CHANGES.register("add")
def _add(rng: random.Random, rules: list[Constraint], topic: Topic) -> Change | None:
    try:
        (new,) = sample_constraints(rng, 1, topic.keywords, exclude=[c.kind for c in rules])
    except ValueError:
        return None
    return Change("add", [*rules, new], f"Also follow one more rule: {new.describe()}")


@CHANGES.register("modify")
def _modify(rng: random.Random, rules: list[Constraint], topic: Topic) -> Change | None:
    tunable = [c for c in rules if fields(c)]  # type: ignore[arg-type]
    if not tunable:
        return None
    old = rng.choice(tunable)
    for _ in range(10):
        new = type(old).sample(rng, topic.keywords)
        if new.describe() != old.describe():
            break
    else:
        return None
    return Change(
        "modify", [new if c is old else c for c in rules],
        f"Change one of my rules.\nOld rule: {old.describe()}\nNew rule: {new.describe()}",
        dropped=[old],
    )


@CHANGES.register("replace")
def _replace(rng: random.Random, rules: list[Constraint], topic: Topic) -> Change | None:
    options = [
        (old, kind)
        for old in rules
        for kind in CONSTRAINTS.names()
        if kind != old.kind and conflicting(old.kind, kind)
        and compatible(kind, [c.kind for c in rules if c is not old])
    ]
    if not options:
        return None
    old, kind = rng.choice(options)
    new = CONSTRAINTS.get(kind).sample(rng, topic.keywords)
    return Change(
        "replace", [new if c is old else c for c in rules],
        f"Drop this rule: {old.describe()}\nInstead, follow this one: {new.describe()}",
        dropped=[old],
    )


@CHANGES.register("drop")
def _drop(rng: random.Random, rules: list[Constraint], topic: Topic) -> Change | None:
    if len(rules) < 2:
        return None
    old = rng.choice(rules)
    return Change(
        "drop", [c for c in rules if c is not old],
        f"You no longer need to follow this rule: {old.describe()}", dropped=[old],
    )


def draw_change(rng: random.Random, rules: list[Constraint], topic: Topic) -> tuple[Change, str]:
    """A rule change the writer can satisfy for ``topic``, with the writer's response."""
    for _ in range(MAX_CHANGE_TRIES):
        change = CHANGES.get(rng.choice(CHANGES.names()))(rng, rules, topic)
        if change is None:
            continue
        reply = write_response(topic, change.constraints)
        if reply is not None:
            return change, reply
    raise RuntimeError(f"no satisfiable rule change for {[c.kind for c in rules]} on {topic.name!r}")


def first_turn(request: Request, tone: str, rules: Sequence[Constraint]) -> str:
    return (f"{request.text} Use a {tone} tone.\n\nFollow these rules in your reply:\n{rules_text(rules)}\n\n"
            "Reply with the requested text only.")


def later_turn(request: Request | None, change: Change) -> str:
    if request is None:
        head = "Thanks. Please rewrite your last answer with one change."
    else:
        head = f"Thanks. Now {request.text[0].lower()}{request.text[1:]} Keep the same tone."
    return f"{head}\n{change.instruction}\nAll my other rules still apply."


def rubric_for(ground_truth: dict) -> str:
    """What the judge grades against; rebuilt from the task's ground truth at verify time."""
    r = ground_truth["request"]
    rules = [constraint_from_dict(d) for d in ground_truth["constraints"]]
    dropped = [constraint_from_dict(d) for d in ground_truth["dropped"]]
    lines = [
        f"The final response must answer the user's latest request: {r['text']} "
        f"The tone must be {ground_truth['tone']}, as asked in the first turn.",
        "It must follow every rule in force at the end of the conversation:",
        rules_text(rules),
    ]
    if dropped:
        lines += ["These earlier rules were changed or dropped by the user and no longer apply; "
                  "do not hold them against the response:", rules_text(dropped)]
    lines.append("Give 10 only if the request, the tone and every rule in force are met; take points "
                 "off for each miss; give 0 if the response ignores the latest request.")
    return "\n".join(lines)


def judge_prompt(task: Task, reply: str) -> list[Message]:
    conversation = [*task.messages, {"role": "assistant", "content": reply}]
    return build_judge_prompt(conversation, rubric_for(task.ground_truth))


@ENVIRONMENTS.register("instruction_multiturn")
class InstructionMultiTurnEnv(Environment):
    name = "instruction_multiturn"
    domain = "instruction_following"

    def __init__(self, judge: Judge | str | None = None, default_size: int = 1000) -> None:
        self.judge = LazyJudge(judge)
        self.default_size = default_size

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        if n is None:
            n = self.default_size if split == "train" else max(1, self.default_size // 10)
        return sample_tasks(self.make_task, split, n, seed, stream=self.name)

    def make_task(self, rng: random.Random) -> Task:
        request, tone = sample_request(rng), rng.choice(TONES)
        rules, reply = draw_satisfiable(rng, request.topic, 2)
        messages: list[Message] = [
            {"role": "user", "content": first_turn(request, tone, rules)},
            {"role": "assistant", "content": reply},
        ]
        n_later = rng.randint(1, 2)
        dropped: list[Constraint] = []
        ops: list[str] = []
        for turn in range(n_later):
            new_request = sample_request(rng) if rng.random() < 0.5 else None
            request = new_request or request
            change, reply = draw_change(rng, rules, request.topic)
            rules = change.constraints
            dropped = [d for d in dropped + change.dropped if not any(d == r for r in rules)]
            ops.append(change.op)
            messages.append({"role": "user", "content": later_turn(new_request, change)})
            if turn < n_later - 1:
                messages.append({"role": "assistant", "content": reply})
        # The stored reference for the final turn also satisfies the substance rule.
        final_prompt = "\n".join(m["content"] for m in messages if m["role"] == "user")
        words, need = topic_words(request.topic), min_words(rules)
        reply = write_response(request.topic, rules,
                               lambda text: check_substance(text, final_prompt, words, need).ok) or reply
        ground_truth = {
            "constraints": [c.to_dict() for c in rules],
            "dropped": [c.to_dict() for c in dropped],
            "request": {"text": request.text, "topic": request.topic.name, "form": request.form},
            "tone": tone,
        }
        return Task(
            id=content_id(self.name, {"messages": messages, "ground_truth": ground_truth}),
            domain=self.domain,
            messages=messages,
            ground_truth=ground_truth,
            metadata={"changes": ops, "user_turns": 1 + n_later, "reference_response": reply},
        )

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        reply = final_answer_text(messages)
        rules = [constraint_from_dict(d) for d in task.ground_truth["constraints"]]
        checked = grade_constraints(rules, reply, prompt=user_text(task),
                                    topic=topic_words(task.ground_truth["request"]["topic"]))
        if checked.reward < 1.0:
            return VerifyResult(0.0, checked.components, f"{checked.reason}; judge not asked")
        verdict = self.judge.get().judge(judge_prompt(task, reply))
        score = judge_score(verdict)
        return VerifyResult(score, {**checked.components, "judge": score}, f"rules hold; judge: {verdict.reason} {score:.1f}")
