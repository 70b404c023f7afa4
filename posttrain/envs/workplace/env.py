"""The workplace environment: an assistant with 26 tools over email, calendar, CRM, projects, analytics.

Reward (docs/recipe.md §2.7): 1 when the database state after the model's tool calls equals the state
the task's reference calls produce, else 0. Question tasks (read-only) also need the right value
after "Answer:" in the final reply, and must leave the state untouched.

Task universe: ``N_WORLDS`` generated companies × one task per template each (21 templates, a few
draws have no valid instance and are skipped). Task ``i`` uses world ``i // len(TEMPLATES)`` and
template ``i % len(TEMPLATES)``; its id names both. Split membership is a hash of the id (10%
dev, test: ``splits.split_of``), so the three are disjoint by construction.
``tasks(split, n, seed)``: the split's tasks in an order shuffled by ``seed``, first ``n``.

Episode: the live database is built from the task's world seed. Each assistant message with tool
calls is executed (one tool-role observation per call); a message without tool calls is the final
reply and ends the episode; so does ``max_turns``. ``verify`` is stateless: it rebuilds the
database and replays the transcript's calls (see ``posttrain/envs/tools.py``).
"""

from __future__ import annotations

import re

from posttrain.envs.base import (
    ENVIRONMENTS, Environment, Message, Split, StepResult, Task, VerifyResult, final_answer_text,
)
from posttrain.envs.tools import ToolEpisode, check_transcript, normalize_text, select_tasks
from posttrain.envs.workplace.data import STATE_SPECS, build_db, generate_world
from posttrain.envs.workplace.tasks import TEMPLATES, draft_task, ground_truth
from posttrain.envs.workplace.tools import TOOLBOX

N_WORLDS = 40
SYSTEM_PROMPT = (
    "You are a workplace assistant for {name} ({email}) at Acme Corp. Through the tools you can read and "
    "change their email, calendar, the CRM, project tasks, and read product analytics. Today is {weekday}, "
    "{today}, and the time is 09:00. Dates are written YYYY-MM-DD and times HH:MM (24-hour); look up a "
    "colleague's email address with directory_search. Do exactly what the user asks, nothing more. When the "
    "request is done, reply with a short confirmation and no tool call: that reply ends the conversation."
)


_ANSWER_RE = re.compile(r"answer\s*:\s*(.+)", re.I)


def extract_answer(text: str) -> str | None:
    """The value after the last 'Answer:' in the reply (first line, markdown emphasis stripped)."""
    found = _ANSWER_RE.findall(text)
    if not found:
        return None
    return found[-1].splitlines()[0].strip().strip("*_`").strip() or None


def _as_number(s: str) -> float | None:
    try:
        return float(s.replace(",", "").replace("$", "").strip())
    except ValueError:
        return None


def answer_matches(expected: str, got: str | None) -> bool:
    """Numbers compare by value (commas, '$' ignored); text compares after ``normalize_text``."""
    if got is None:
        return False
    e, g = _as_number(expected), _as_number(got)
    if e is not None:
        return g is not None and abs(e - g) < 1e-6
    return normalize_text(expected) == normalize_text(got)


class WorkplaceEpisode(ToolEpisode):
    def step(self, assistant_message: Message) -> StepResult:
        turn = self.begin_turn(assistant_message)
        if turn.parse_error is None and not turn.calls:
            self.done = True
            return StepResult([], True, {"reason": "final_reply"})
        observations = self.execute(turn)
        self.done = self.out_of_turns
        return StepResult(observations, self.done, {"reason": "max_turns"} if self.done else {})


@ENVIRONMENTS.register("workplace")
class WorkplaceEnv(Environment):
    name = "workplace"
    domain = "tool_use"
    multi_turn = True

    def __init__(self, max_turns: int = 20, n_worlds: int = N_WORLDS) -> None:
        self.max_turns = max_turns
        self.n_worlds = n_worlds

    # ------------------------------------------------------------------ tasks

    @staticmethod
    def task_id(index: int) -> str:
        return f"workplace/{list(TEMPLATES)[index % len(TEMPLATES)]}/{index:05d}"

    def task_at(self, index: int) -> Task | None:
        name, world_seed = list(TEMPLATES)[index % len(TEMPLATES)], index // len(TEMPLATES)
        task_id = self.task_id(index)
        drafted = draft_task(name, world_seed, task_id)
        if drafted is None:
            return None
        world, draft = drafted
        system = SYSTEM_PROMPT.format(name=world.user["name"], email=world.user["email"],
                                      weekday=f"{world.today:%A}", today=world.today.isoformat())
        return Task(
            id=task_id, domain=self.domain,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": draft.prompt}],
            ground_truth=ground_truth(world_seed, draft), tools=TOOLBOX.definitions(),
            metadata={"world_seed": world_seed, "template": name},
        )

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return select_tasks(self.n_worlds * len(TEMPLATES), split, n, seed, self.task_id, self.task_at)

    # ------------------------------------------------------------------ grading

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        gt, seed = task.ground_truth, task.metadata["world_seed"]
        check = check_transcript(TOOLBOX, lambda: build_db(seed), task, STATE_SPECS, messages)
        components, reasons, ok = check.components(), [check.reason()], check.match
        if gt.get("answer") is not None:
            got = extract_answer(final_answer_text(messages))
            answer_ok = answer_matches(gt["answer"], got)
            components["answer_match"] = float(answer_ok)
            reasons.append(f"answer {got!r} {'==' if answer_ok else '!='} expected {gt['answer']!r}")
            ok = ok and answer_ok
        return VerifyResult(reward=float(ok), components=components, reason="; ".join(reasons))

    def start_episode(self, task: Task) -> WorkplaceEpisode:
        return WorkplaceEpisode(task, TOOLBOX, build_db(task.metadata["world_seed"]), self.max_turns)


def world_of(task: Task):
    """The generated world behind a task (for scripts and tests that want to look at the data)."""
    return generate_world(task.metadata["world_seed"])
