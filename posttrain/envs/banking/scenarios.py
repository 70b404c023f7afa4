"""Banking scenarios: what the customer wants, what they know, and what a correct agent does.

Each scenario draws a concrete case from a generated bank (``data.py``): the customer, the hidden
facts the simulated user will reveal when asked (``user.UserFacts``), and the reference calls of a
correct agent. Every reference starts with ``lookup_customer`` and ``verify_identity`` because the
policy says so; only the state-changing calls matter for grading, the look-ups make the reference
a plausible trajectory to read.

* ``unblock_card``: a card blocked for suspicious activity or PIN attempts; verify, then unblock it
  (when the customer has several blocked cards, the agent must ask which one).
* ``dispute_charge``: a transaction described by merchant, amount and date (the same merchant
  appears in other transactions of the customer); verify, find it, ask the reason, file a dispute.
* ``card_already_active`` (distractor): the customer believes a card is blocked but it is active,
  and where possible another of their cards is blocked in a way the agent could undo; the right
  outcome is verification and no change, and the goal is met when the agent says the card is active.
* ``charge_not_found`` (distractor): the described charge does not exist; a transaction at the
  same merchant on the same date with a different amount does. Verify, dispute nothing, tell them.

``goal_met`` decides when the simulated user is satisfied: from the live database for the action
scenarios, from the agent's words for the distractors (keyword patterns, like the intents).
"""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any, ClassVar

from posttrain.envs.banking.data import DISPUTE_REASONS, UNBLOCKABLE, BankDB, World, format_amount
from posttrain.envs.banking.user import CLOSING, NOTHING_TO_DO_CLOSING, UserFacts

Call = dict[str, Any]

CARD_OPENINGS = [
    "Hi, my card has been blocked and I can't pay with it. Can you unblock it?",
    "Hello, one of my cards stopped working and the app says it's blocked. Please help me get it unblocked.",
    "Hi there. My card was declined at the store today, I think it's blocked. I need it unblocked.",
]
CARD_GOAL = "I just need my blocked card to work again."
CHARGE_OPENINGS = [
    "Hi, there's a charge on my account that I want to dispute.",
    "Hello, I'd like to dispute a transaction on my card.",
    "Hi, I found a charge I need to contest. Can you help?",
]
CHARGE_GOAL = "I want to dispute a charge on my account."

ALREADY_ACTIVE = re.compile(
    r"already (active|unblocked|working)|\b(is|it's) (currently |still )?active|"
    r"\bnot (currently )?blocked|isn't blocked|no block", re.I)
NOT_FOUND = re.compile(
    r"(could not|couldn't|can't|cannot|unable to|did not|didn't|don't|do not) (find|see|locate)|"
    r"no (matching|such|record|transaction|charge)|not (find|found|see)|"
    r"(doesn't|does not|don't|do not) (appear|show)", re.I)


def call(tool: str, /, **arguments: Any) -> Call:
    return {"name": tool, "arguments": arguments}


def spoken_date(iso: str) -> str:
    d = dt.date.fromisoformat(iso)
    return f"{d:%B} {d.day}"


def _identity_calls(customer: dict[str, Any]) -> list[Call]:
    return [call("lookup_customer", name=customer["name"]),
            call("verify_identity", customer_id=customer["id"], ssn_last4=customer["ssn_last4"])]


def _facts(scenario: str, customer: dict[str, Any], openings: list[str], goal: str,
           rng: random.Random) -> UserFacts:
    return UserFacts(scenario=scenario, name=customer["name"], ssn_last4=customer["ssn_last4"],
                     customer_id=customer["id"], opening=rng.choice(openings), goal=goal, card=None,
                     charge=None, reason=None)


def _card_fact(card: dict[str, Any]) -> dict[str, Any]:
    return {"card_id": card["id"], "last4": card["last4"], "kind": card["kind"]}


class Scenario:
    name: ClassVar[str]
    closing: ClassVar[str] = CLOSING  # what the user says when ``goal_met``

    def draw(self, world: World, rng: random.Random) -> tuple[UserFacts, list[Call]] | None:
        raise NotImplementedError

    def goal_met(self, db: BankDB, facts: UserFacts, agent_text: str) -> bool:
        raise NotImplementedError


SCENARIOS: dict[str, Scenario] = {}


def scenario(cls: type[Scenario]) -> type[Scenario]:
    SCENARIOS[cls.name] = cls()
    return cls


@scenario
class UnblockCard(Scenario):
    name = "unblock_card"

    def draw(self, world, rng):
        cards = [c for c in world.cards if c["status"] == "blocked" and c["block_reason"] in UNBLOCKABLE]
        if not cards:
            return None
        card = rng.choice(cards)
        customer = world.customer(card["customer_id"])
        facts = _facts(self.name, customer, CARD_OPENINGS, CARD_GOAL, rng)
        facts["card"] = _card_fact(card)
        calls = [*_identity_calls(customer), call("list_cards", customer_id=customer["id"]),
                 call("unblock_card", card_id=card["id"])]
        return facts, calls

    def goal_met(self, db, facts, agent_text):
        row = db.conn.execute("SELECT status FROM cards WHERE id = ?", [facts["card"]["card_id"]]).fetchone()
        return row["status"] == "active"


@scenario
class CardAlreadyActive(Scenario):
    name = "card_already_active"
    closing = NOTHING_TO_DO_CLOSING

    def draw(self, world, rng):
        def has_active(cid: int) -> bool:
            return any(c["status"] == "active" for c in world.cards_of(cid))

        def has_unblockable(cid: int) -> bool:
            return any(c["block_reason"] in UNBLOCKABLE for c in world.cards_of(cid))

        # Best distractor: another card of theirs that the agent *could* wrongly unblock.
        active = [c for c in world.customers if has_active(c["id"])]
        pool = [c for c in active if has_unblockable(c["id"])] or active
        if not pool:
            return None
        customer = rng.choice(pool)
        card = rng.choice([c for c in world.cards_of(customer["id"]) if c["status"] == "active"])
        facts = _facts(self.name, customer, CARD_OPENINGS, CARD_GOAL, rng)
        facts["card"] = _card_fact(card)
        return facts, [*_identity_calls(customer), call("list_cards", customer_id=customer["id"])]

    def goal_met(self, db, facts, agent_text):
        return bool(ALREADY_ACTIVE.search(agent_text))


def _has_sibling(txn: dict[str, Any], customer_txns: list[dict[str, Any]]) -> bool:
    return any(t["merchant"] == txn["merchant"] and t["id"] != txn["id"] for t in customer_txns)


@scenario
class DisputeCharge(Scenario):
    name = "dispute_charge"

    def draw(self, world, rng):
        customer = rng.choice(world.customers)
        txns = world.transactions_of(customer["id"])
        # A sibling at the same merchant makes "find the right one" a real step.
        pool = [t for t in txns if _has_sibling(t, txns)] or txns
        txn = rng.choice(pool)
        facts = _facts(self.name, customer, CHARGE_OPENINGS, CHARGE_GOAL, rng)
        facts["charge"] = {"merchant": txn["merchant"], "amount": format_amount(txn["amount_cents"]),
                           "date": txn["date"], "spoken_date": spoken_date(txn["date"]), "transaction_id": txn["id"]}
        facts["reason"] = rng.choice(DISPUTE_REASONS)
        calls = [*_identity_calls(customer),
                 call("list_transactions", customer_id=customer["id"], merchant=txn["merchant"]),
                 call("file_dispute", transaction_id=txn["id"], reason=facts["reason"])]
        return facts, calls

    def goal_met(self, db, facts, agent_text):
        row = db.conn.execute("SELECT 1 FROM disputes WHERE transaction_id = ?",
                              [facts["charge"]["transaction_id"]]).fetchone()
        return row is not None


@scenario
class ChargeNotFound(Scenario):
    name = "charge_not_found"
    closing = NOTHING_TO_DO_CLOSING

    def draw(self, world, rng):
        customer = rng.choice(world.customers)
        txns = world.transactions_of(customer["id"])
        near = rng.choice(txns)  # the real transaction the description almost matches
        existing = {(t["merchant"], t["date"], t["amount_cents"]) for t in txns}
        cents = near["amount_cents"] + rng.choice([-1, 1]) * rng.randint(100, 3000)
        while cents < 100 or (near["merchant"], near["date"], cents) in existing:
            cents = abs(cents) + 137
        facts = _facts(self.name, customer, CHARGE_OPENINGS, CHARGE_GOAL, rng)
        facts["charge"] = {"merchant": near["merchant"], "amount": format_amount(cents), "date": near["date"],
                           "spoken_date": spoken_date(near["date"]), "transaction_id": None}
        facts["reason"] = rng.choice(DISPUTE_REASONS)
        calls = [*_identity_calls(customer),
                 call("list_transactions", customer_id=customer["id"], merchant=near["merchant"])]
        return facts, calls

    def goal_met(self, db, facts, agent_text):
        return bool(NOT_FOUND.search(agent_text))
