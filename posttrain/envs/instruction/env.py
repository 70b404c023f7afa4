"""Single-turn instruction following with verifiable constraints (docs/recipe.md §2.5).

A task is a base request ("Write a short note about lighthouses for your neighbours.") plus 2–4
constraints of distinct, mutually compatible kinds drawn from ``constraints.CONSTRAINTS``. A
combination is kept only if the scripted writer can satisfy it (the few word-count × sentence-count
combinations it cannot are redrawn), and the writer's text is stored as
``metadata["reference_response"]``.

Reward: 1 when every constraint holds, else 0 (IFEval "strict" accuracy; no partial credit, so the
policy cannot farm the easy constraints). ``components`` holds one 0/1 per constraint kind, so
per-constraint pass rates can still be logged, and ``reason`` lists the failing ones. The graded text
is ``final_answer_text``: the last assistant message with its reasoning block removed.
"""

from __future__ import annotations

import random
from typing import Sequence

from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, Task, VerifyResult, final_answer_text
from posttrain.envs.instruction.common import content_id, sample_tasks
from posttrain.envs.instruction.constraints import Constraint, constraint_from_dict, sample_constraints
from posttrain.envs.instruction.topics import Topic, sample_request
from posttrain.envs.instruction.writer import write_response

MAX_REDRAWS = 50


def rules_text(constraints: Sequence[Constraint]) -> str:
    return "\n".join(f"{i}. {c.describe()}" for i, c in enumerate(constraints, 1))


def draw_satisfiable(
    rng: random.Random, topic: Topic, n: int, exclude: Sequence[str] = ()
) -> tuple[list[Constraint], str]:
    """``n`` compatible constraints the scripted writer can satisfy, and the writer's response."""
    for _ in range(MAX_REDRAWS):
        constraints = sample_constraints(rng, n, topic.keywords, exclude)
        reference = write_response(topic, constraints)
        if reference is not None:
            return constraints, reference
    raise RuntimeError(f"no satisfiable set of {n} constraints for {topic.name!r} in {MAX_REDRAWS} draws")


def grade_constraints(constraints: Sequence[Constraint], text: str) -> VerifyResult:
    """1 if ``text`` satisfies every constraint, else 0; one 0/1 component per constraint kind."""
    if not text.strip():
        return VerifyResult(0.0, {c.kind: 0.0 for c in constraints}, "empty answer")
    checks = {c.kind: c.evaluate(text) for c in constraints}
    failed = [f"{kind} ({check.reason})" for kind, check in checks.items() if not check.ok]
    components = {kind: float(check.ok) for kind, check in checks.items()}
    if failed:
        return VerifyResult(0.0, components, "failed: " + "; ".join(failed))
    return VerifyResult(1.0, components, f"all {len(checks)} constraints hold")


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
        constraints, reference = draw_satisfiable(rng, request.topic, n)
        prompt = (
            f"{request.text}\n\nYour response must follow these rules:\n{rules_text(constraints)}\n\n"
            "Your whole reply is checked against these rules, so reply with the requested text only."
        )
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
        return grade_constraints(constraints_of(task), final_answer_text(messages))
