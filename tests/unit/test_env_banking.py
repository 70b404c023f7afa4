"""Banking environment: policy-aware state grading, the simulated user, episodes end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from posttrain.envs.banking.data import build_db, generate_world
from posttrain.envs.banking.env import BankingEnv
from posttrain.envs.banking.expert import expert_agent, play, say, tool
from posttrain.envs.banking.scenarios import SCENARIOS
from posttrain.envs.banking.tools import TOOLBOX
from posttrain.envs.banking.user import CLOSING, GIVE_UP, MAX_IDLE, RuleBasedUser, detect_intents
from posttrain.envs.base import ENVIRONMENTS, Task
from posttrain.envs.tools import calls_message
from posttrain.models.chat_template import ToolCall, format_tool_call

ENV = BankingEnv()
NAMES = list(SCENARIOS)


def tasks_of(scenario: str, k: int = 3) -> list[Task]:
    """The first ``k`` tasks of a scenario (task i has scenario i % 4)."""
    out = [ENV.task_at(NAMES.index(scenario) + len(NAMES) * j) for j in range(k)]
    assert all(t is not None for t in out)
    return out


def with_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [calls_message([c]) for c in calls] + [{"role": "assistant", "content": "Done, anything else?"}]


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"name": tool, "arguments": arguments}


def identity(task: Task) -> list[dict[str, Any]]:
    f = task.metadata["user_facts"]
    return [call("verify_identity", customer_id=f["customer_id"], ssn_last4=f["ssn_last4"])]


# --------------------------------------------------------------------------- grading


def test_registered():
    assert "banking" in ENVIRONMENTS and ENV.domain == "tool_use" and ENV.multi_turn
    assert {"lookup_customer", "verify_identity", "list_cards", "unblock_card", "list_transactions",
            "file_dispute"} <= set(TOOLBOX.names())


@pytest.mark.parametrize("scenario", NAMES)
def test_reference_calls_get_reward_one_and_nothing_gets_zero(scenario):
    for task in tasks_of(scenario):
        assert ENV.verify(task, with_calls(task.ground_truth["reference_calls"])).reward == 1.0
        # Even the distractors need a verified customer: doing nothing is not a solution.
        assert ENV.verify(task, [{"role": "assistant", "content": "Sorry, I can't help."}]).reward == 0.0


def test_unblocking_before_verification_gets_zero():
    task = tasks_of("unblock_card", 1)[0]
    card_id = task.metadata["user_facts"]["card"]["card_id"]
    unblock = [call("unblock_card", card_id=card_id)]
    assert ENV.verify(task, with_calls(identity(task) + unblock)).reward == 1.0
    result = ENV.verify(task, with_calls(unblock + identity(task)))
    assert result.reward == 0.0 and "actions: log differs" in result.reason


def test_unblocking_the_wrong_card_gets_zero():
    def other_blocked(task: Task) -> list[dict[str, Any]]:
        f = task.metadata["user_facts"]
        cards = generate_world(task.metadata["world_seed"]).cards_of(f["customer_id"])
        return [c for c in cards if c["id"] != f["card"]["card_id"] and c["status"] == "blocked"
                and c["block_reason"] != "reported_lost"]

    # A distractor task whose customer has a blocked card that could be (wrongly) unblocked.
    task = next(t for t in tasks_of("card_already_active", 10) if other_blocked(t))
    wrong = [call("unblock_card", card_id=other_blocked(task)[0]["id"])]
    assert ENV.verify(task, with_calls(identity(task) + wrong)).reward == 0.0


def test_disputes_must_hit_the_right_transaction_with_the_right_reason():
    task = tasks_of("dispute_charge", 1)[0]
    f = task.metadata["user_facts"]
    txn = f["charge"]["transaction_id"]
    other_reason = next(r for r in ("unauthorized", "wrong_amount", "not_received") if r != f["reason"])
    sibling = next(t for t in generate_world(task.metadata["world_seed"]).transactions_of(f["customer_id"])
                   if t["id"] != txn)
    assert ENV.verify(task, with_calls(identity(task) + [call("file_dispute", transaction_id=txn, reason=f["reason"],
                                                                description="Customer says so.")])).reward == 1.0
    assert ENV.verify(task, with_calls(identity(task) + [call("file_dispute", transaction_id=txn,
                                                                reason=other_reason)])).reward == 0.0
    assert ENV.verify(task, with_calls(identity(task) + [call("file_dispute", transaction_id=sibling["id"],
                                                                reason=f["reason"])])).reward == 0.0


def test_disputing_the_near_miss_of_a_missing_charge_gets_zero():
    task = tasks_of("charge_not_found", 1)[0]
    f = task.metadata["user_facts"]
    world = generate_world(task.metadata["world_seed"])
    near = next(t for t in world.transactions_of(f["customer_id"])
                if t["merchant"] == f["charge"]["merchant"] and t["date"] == f["charge"]["date"])
    assert ENV.verify(task, with_calls(identity(task))).reward == 1.0
    assert ENV.verify(task, with_calls(identity(task) + [call("file_dispute", transaction_id=near["id"],
                                                                reason=f["reason"])])).reward == 0.0


def test_guessing_ssn_digits_locks_the_customer_but_one_typo_is_forgiven():
    task = tasks_of("card_already_active", 1)[0]
    f = task.metadata["user_facts"]
    wrong = call("verify_identity", customer_id=f["customer_id"], ssn_last4=f"{(int(f['ssn_last4']) + 1) % 10000:04d}")
    assert ENV.verify(task, with_calls([wrong] + identity(task))).reward == 1.0
    result = ENV.verify(task, with_calls([wrong] * 3 + identity(task)))
    assert result.reward == 0.0 and result.components["tool_errors"] == 1.0  # the locked verify is an error


def test_tools_refuse_impossible_actions():
    db = build_db(0)
    w = db.world
    lost = next(c for c in w.cards if c["block_reason"] == "reported_lost")
    active = next(c for c in w.cards if c["status"] == "active")
    assert TOOLBOX.execute(db, ToolCall("unblock_card", {"card_id": lost["id"]})).error == "card_reported_lost"
    assert TOOLBOX.execute(db, ToolCall("unblock_card", {"card_id": active["id"]})).error == "card_not_blocked"
    assert TOOLBOX.execute(db, ToolCall("lookup_customer", {})).error == "missing_argument"
    assert TOOLBOX.execute(db, ToolCall("verify_identity", {"customer_id": 1, "ssn_last4": "12"})).error \
        == "bad_argument_value"
    dispute = ToolCall("file_dispute", {"transaction_id": 1, "reason": "unauthorized"})
    assert TOOLBOX.execute(db, dispute).ok
    assert TOOLBOX.execute(db, dispute).error == "already_disputed"
    assert TOOLBOX.execute(db, ToolCall("file_dispute", {"transaction_id": 1, "reason": "boredom"})).error \
        == "bad_argument_value"


# --------------------------------------------------------------------------- simulated user


@pytest.mark.parametrize(
    "text, intents",
    [
        ("Could you please give me your full name and the last four digits of your SSN?", ["identity"]),
        ("To verify you, what are the last 4 digits of your social security number?", ["identity"]),
        ("Thanks! Which card is blocked? The last four digits of the card are enough.", ["card"]),
        ("Which transaction is it? Please tell me the merchant, amount and date.", ["charge"]),
        ("Why are you disputing this charge?", ["reason"]),
        ("I found it. Shall I go ahead and file the dispute?", ["confirm"]),
        ("What's your name? And which card ending do you mean?", ["identity", "card"]),
        ("I have verified your identity. The card is now active.", []),
        ("Your dispute was filed.", []),
        ("", []),
    ],
)
def test_detect_intents(text, intents):
    assert detect_intents(text) == intents


def test_user_answers_from_facts_and_closes_or_gives_up():
    facts = tasks_of("dispute_charge", 1)[0].metadata["user_facts"]
    user = RuleBasedUser(facts)
    reply, done = user.reply("May I have your name and SSN's last four digits?", goal_met=False)
    assert facts["name"] in reply and facts["ssn_last4"] in reply and not done
    reply, done = user.reply("Which card is it?", goal_met=False)
    assert "isn't about a specific card" in reply and not done
    reply, _ = user.reply("Please describe the charge: merchant, amount and date?", goal_met=False)
    assert facts["charge"]["merchant"] in reply and f"${facts['charge']['amount']}" in reply
    assert user.reply("Ok.", goal_met=True) == (CLOSING, True)
    idle = RuleBasedUser(facts)
    replies = [idle.reply("Hmm.", goal_met=False) for _ in range(MAX_IDLE)]
    assert replies[0] == (facts["goal"], False) and replies[-1] == (GIVE_UP, True)


# --------------------------------------------------------------------------- episodes

def run_episode(task: Task, call_format: str):
    episode = ENV.start_episode(task)
    transcript, last = play(episode, expert_agent(task, call_format))
    return transcript, episode, last


@pytest.mark.parametrize("scenario", NAMES)
@pytest.mark.parametrize("fmt", ["openai", "xml"])
def test_expert_agent_solves_every_scenario_end_to_end(scenario, fmt):
    closing = SCENARIOS[scenario].closing
    assert "goodbye" in closing.lower()
    for task in tasks_of(scenario, 2):
        transcript, episode, last = run_episode(task, fmt)
        assert last.info["reason"] == "user_ended" and transcript[-1] == {"role": "user", "content": closing}
        assert not any(k.startswith("error:") for k in episode.stats), episode.stats
        assert ENV.verify(task, transcript).reward == 1.0, task.id
        episode.close()


def test_episode_malformed_calls_are_observations_and_text_goes_to_the_user():
    task = tasks_of("unblock_card", 1)[0]
    episode = ENV.start_episode(task)
    for bad in (say("<tool_call>\n<function=unblock_card>"), say(format_tool_call("wire_money", {"to": "me"})),
                tool("unblock_card", "openai", card_id="the blue one")):
        step = episode.step(bad)
        assert not step.done and step.observations[0]["role"] == "tool"
        assert "error" in json.loads(step.observations[0]["content"])
    step = episode.step(say("Hello! What is your full name, please?"))
    reply = step.observations[0]
    assert reply["role"] == "user" and task.metadata["user_facts"]["name"] in reply["content"]
    assert episode.stats == {"turns": 4, "tool_calls": 2, "error:unbalanced_tool_call_tags": 1,
                             "error:unknown_tool": 1, "error:bad_argument_type": 1, "user_turns": 1}


def test_episode_ends_when_user_gives_up_or_turns_run_out():
    task = tasks_of("dispute_charge", 1)[0]
    episode = ENV.start_episode(task)
    steps = [episode.step(say("Let me think.")) for _ in range(MAX_IDLE)]
    assert steps[-1].done and steps[-1].info["reason"] == "user_ended"
    short = BankingEnv(max_turns=1).start_episode(task)
    step = short.step(tool("lookup_customer", "openai", name="x"))
    assert step.done and step.info["reason"] == "max_turns"


# --------------------------------------------------------------------------- task lists


def test_tasks_are_deterministic_disjoint_and_json():
    a = ENV.tasks("dev", n=8, seed=5)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in BankingEnv().tasks("dev", n=8, seed=5)]
    small = BankingEnv(n_worlds=2)
    train, val = small.tasks("train"), small.tasks("dev")
    assert val and {t.id for t in train}.isdisjoint({t.id for t in val})
    assert {t.metadata["scenario"] for t in train} == set(NAMES)
    for t in a:
        assert json.loads(json.dumps(t.to_dict())) == t.to_dict()
        assert t.messages[0]["role"] == "system" and "verify" in t.messages[0]["content"]
        assert t.messages[1] == {"role": "user", "content": t.metadata["user_facts"]["opening"]}
