"""Single-turn instruction following with verifiable constraints (docs/recipe.md §2.5).

A task is a base request ("Write a short note about lighthouses for your neighbours.") plus 2–4
constraints of distinct, mutually compatible kinds drawn from ``constraints.CONSTRAINTS``. A
combination is kept only if the scripted writer can satisfy it (the few word-count × sentence-count
combinations it cannot are redrawn), and the writer's text is stored as
``metadata["reference_response"]``.

Reward: 1 when every constraint holds *and* the reply addresses the request, else 0 (IFEval "strict"
accuracy; no partial credit, so the policy cannot farm the easy constraints). "Addresses the
request" is the substance rule of ``substance.py``: at least 20 words (fewer only if a word-count
rule caps the reply lower), at least one word of the topic's name ("school" or "lunches", or a
form of them, for a text about school lunches; the keywords a keyword rule asks for do not count),
at least 5 distinct words not taken from the prompt, and no run of 10 words copied from it. Without it, "ok." scored 1.0 on 24 of 2,000 training tasks (all lowercase, no commas, at
most 150 words). ``components`` holds one 0/1 per constraint kind and ``substance``, so
per-constraint pass rates can still be logged, and ``reason`` lists the failing ones. The graded text
is ``final_answer_text``: the last assistant message with its reasoning block removed. The stored
reference response satisfies the constraints and the substance rule.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, Task, VerifyResult, final_answer_text
from posttrain.envs.instruction.common import content_id, sample_tasks
from posttrain.envs.instruction.constraints import Constraint, constraint_from_dict, sample_constraints
from posttrain.envs.instruction.substance import check_substance, min_words, topic_words
from posttrain.envs.instruction.topics import Topic, sample_request
from posttrain.envs.instruction.writer import write_response

MAX_REDRAWS = 50


def rules_text(constraints: Sequence[Constraint]) -> str:
    return "\n".join(f"{i}. {c.describe()}" for i, c in enumerate(constraints, 1))


def draw_satisfiable(
    rng: random.Random, topic: Topic, n: int, exclude: Sequence[str] = (), prompt: Callable[[list[Constraint]], str] | None = None
) -> tuple[list[Constraint], str]:
    """``n`` compatible constraints the scripted writer can satisfy, and the writer's response.

    With ``prompt`` (constraints → the prompt they make), the response also satisfies the
    substance rule for that prompt."""
    for _ in range(MAX_REDRAWS):
        constraints = sample_constraints(rng, n, topic.keywords, exclude)
        accept = None
        if prompt is not None:
            text, words, need = prompt(constraints), topic_words(topic), min_words(constraints)
            accept = lambda reply: check_substance(reply, text, words, need).ok  # noqa: E731
        reference = write_response(topic, constraints, accept)
        if reference is not None:
            return constraints, reference
    raise RuntimeError(f"no satisfiable set of {n} constraints for {topic.name!r} in {MAX_REDRAWS} draws")


def grade_constraints(
    constraints: Sequence[Constraint], text: str, prompt: str | None = None, topic: Sequence[str] = ()
) -> VerifyResult:
    """1 if ``text`` satisfies every constraint (and, when ``prompt`` is given, the substance rule
    against that prompt and ``topic`` words), else 0; one 0/1 component per constraint kind, plus
    ``substance``."""
    if not text.strip():
        empty = {c.kind: 0.0 for c in constraints}
        return VerifyResult(0.0, empty if prompt is None else {**empty, "substance": 0.0}, "empty answer")
    checks = {c.kind: c.evaluate(text) for c in constraints}
    if prompt is not None:
        checks["substance"] = check_substance(text, prompt, topic, min_words(constraints))
    failed = [f"{kind} ({check.reason})" for kind, check in checks.items() if not check.ok]
    components = {kind: float(check.ok) for kind, check in checks.items()}
    if failed:
        return VerifyResult(0.0, components, "failed: " + "; ".join(failed))
    n = len(constraints)
    return VerifyResult(1.0, components, f"all {n} constraints hold" + (" and the reply addresses the request" if prompt is not None else ""))


def constraints_of(task: Task) -> list[Constraint]:
    return [constraint_from_dict(d) for d in task.ground_truth["constraints"]]


@ENVIRONMENTS.register("instruction")
class InstructionEnv(Environment):
    name = "instruction"
    domain = "instruction_following"

    def __init__(self, min_constraints: int = 2, max_constraints: int = 4, default_size: int = 2000) -> None:
        if not 1 <= min_constraints <= max_constraints:
            raise ValueError(f"need 1 <= min_constraints <= max_constraints, got {min_constraints}, {max_constraints}")
        self.min_constraints = min_constraints
        self.max_constraints = max_constraints
        self.default_size = default_size  # tasks(n=None) returns this many (train) or a tenth (validation)

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        if n is None:
            n = self.default_size if split == "train" else max(1, self.default_size // 10)
        return sample_tasks(self.make_task, split, n, seed, stream=self.name)

    def make_task(self, rng: random.Random) -> Task:
        request = sample_request(rng)
        n = rng.randint(self.min_constraints, self.max_constraints)
        constraints, reference = draw_satisfiable(rng, request.topic, n, prompt=lambda cs: make_prompt(request.text, cs))
        prompt = make_prompt(request.text, constraints)
        ground_truth = {"constraints": [c.to_dict() for c in constraints]}
        return Task(
            id=content_id(self.name, {"prompt": prompt, "ground_truth": ground_truth}),
            domain=self.domain,
            messages=[{"role": "user", "content": prompt}],
            ground_truth=ground_truth,
            metadata={
                "topic": request.topic.name,
                "form": request.form,
                "kinds": [c.kind for c in constraints],
                "reference_response": reference,
            },
        )

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        return grade_constraints(constraints_of(task), final_answer_text(messages),
                                 prompt=user_text(task), topic=topic_words(task.metadata.get("topic")))


def make_prompt(request_text: str, constraints: Sequence[Constraint]) -> str:
    return (
        f"{request_text}\n\nYour response must follow these rules:\n{rules_text(constraints)}\n\n"
        "Your whole reply is checked against these rules, so reply with the requested text only."
    )


def user_text(task: Task) -> str:
    """Everything the user said in the task (what the substance rule's "own words" excludes)."""
    return "\n".join(str(m.get("content") or "") for m in task.messages if m.get("role") == "user")
