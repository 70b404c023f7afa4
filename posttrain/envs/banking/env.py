"""The banking environment: a customer-service agent, its tools, and a simulated customer.

Reward (docs/recipe.md §2.7): 1 when the database state after the agent's tool calls equals the state
the scenario's reference calls produce, else 0. The state includes the ordered log of actions with
"was the customer verified" (see ``data.py``), so the policy is graded too: unblocking before
verifying, unblocking the wrong card, disputing the near-miss transaction, or locking the customer
with wrong SSN guesses all end in a different state.

Episode: the task's messages are the system prompt (bank policy) and the customer's opening line.
Each assistant message is either
* tool calls (or a malformed attempt): executed against the live database; the observations are
  tool-role messages (errors included, counted in ``stats``); or
* plain text to the customer: the simulated user (``user.RuleBasedUser``) answers with a
  user-role message, or closes the conversation when the goal is met (``done``).
The episode also ends at ``max_turns`` assistant messages. ``verify`` ignores the user's replies: it
rebuilds the bank from the world seed and replays the transcript's tool calls.

Task universe: ``N_WORLDS`` banks × ``TASKS_PER_WORLD`` tasks, scenarios in rotation (task ``i`` has
scenario ``i % 4`` and world ``i // TASKS_PER_WORLD``); ids name the scenario; 10% of ids hash to
dev / test (``splits.split_of``).
"""

from __future__ import annotations

import random

from posttrain.envs.banking.data import STATE_SPECS, build_db, generate_world
from posttrain.envs.banking.scenarios import SCENARIOS
from posttrain.envs.banking.tools import TOOLBOX
from posttrain.envs.banking.user import RuleBasedUser
from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, StepResult, Task, VerifyResult
from posttrain.envs.tools import ToolEpisode, check_transcript, reference_state, select_tasks, state_hash

N_WORLDS = 50
TASKS_PER_WORLD = 20
SYSTEM_PROMPT = """You are a customer-service agent of Northwind Bank, chatting with a customer. Today is {today}.

Policy:
1. Before you look at or change anything in an account, verify the customer's identity: ask for their full name and the last four digits of their Social Security number, find them with lookup_customer, then call verify_identity with the digits they gave you.
2. Change only what the customer asks for, and only after verification. Never block, unblock or dispute anything on your own initiative.
3. Cards blocked because they were reported lost cannot be unblocked.
4. To dispute a charge, find the exact transaction from the customer's description (merchant, amount, date), ask why they dispute it, and file the dispute with reason "unauthorized" (they did not make the purchase), "wrong_amount" (charged a different amount than agreed) or "not_received" (paid, but the goods never arrived).
5. If what the customer describes does not exist or needs no change, tell them so plainly.

Write to the customer in plain text, one short message at a time. Use tools by replying with tool calls only. The conversation ends when the customer says goodbye."""


class BankingEpisode(ToolEpisode):
    def __init__(self, task: Task, max_turns: int) -> None:
        super().__init__(task, TOOLBOX, build_db(task.metadata["world_seed"]), max_turns)
        self.facts = task.metadata["user_facts"]
        self.scenario = SCENARIOS[task.metadata["scenario"]]
        self.user = RuleBasedUser(self.facts, closing=self.scenario.closing)

    def step(self, assistant_message: Message) -> StepResult:
        turn = self.begin_turn(assistant_message)
        if turn.parse_error is not None or turn.calls:
            observations = self.execute(turn)
            self.done = self.out_of_turns
            return StepResult(observations, self.done, {"reason": "max_turns"} if self.done else {})
        goal_met = self.scenario.goal_met(self.state, self.facts, turn.text)
        reply, user_left = self.user.reply(turn.text, goal_met)
        self.count("user_turns")
        self.done = user_left or self.out_of_turns
        info = {"goal_met": goal_met}
        if self.done:
            info["reason"] = "user_ended" if user_left else "max_turns"
        return StepResult([{"role": "user", "content": reply}], self.done, info)


@ENVIRONMENTS.register("banking")
class BankingEnv(Environment):
    name = "banking"
    domain = "tool_use"
    multi_turn = True

    def __init__(self, max_turns: int = 30, n_worlds: int = N_WORLDS) -> None:
        self.max_turns = max_turns
        self.n_worlds = n_worlds

    @staticmethod
    def task_id(index: int) -> str:
        return f"banking/{list(SCENARIOS)[index % len(SCENARIOS)]}/{index:05d}"

    def task_at(self, index: int) -> Task | None:
        name, world_seed = list(SCENARIOS)[index % len(SCENARIOS)], index // TASKS_PER_WORLD
        task_id = self.task_id(index)
        world = generate_world(world_seed)
        drawn = SCENARIOS[name].draw(world, random.Random(task_id))
        if drawn is None:
            return None
        facts, calls = drawn
        state = reference_state(TOOLBOX, build_db(world_seed), calls, STATE_SPECS)
        return Task(
            id=task_id, domain=self.domain,
            messages=[{"role": "system", "content": SYSTEM_PROMPT.format(today=world.today.isoformat())},
                      {"role": "user", "content": facts["opening"]}],
            ground_truth={"reference_calls": calls, "state_hash": state_hash(state)},
            tools=TOOLBOX.definitions(),
            metadata={"world_seed": world_seed, "scenario": name, "user_facts": dict(facts)},
        )

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return select_tasks(self.n_worlds * TASKS_PER_WORLD, split, n, seed, self.task_id, self.task_at)

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        seed = task.metadata["world_seed"]
        check = check_transcript(TOOLBOX, lambda: build_db(seed), task, STATE_SPECS, messages)
        return VerifyResult(reward=float(check.match), components=check.components(), reason=check.reason())

    def start_episode(self, task: Task) -> BankingEpisode:
        return BankingEpisode(task, self.max_turns)
