"""The simulated bank customer: a deterministic, rule-based user.

The user holds the scenario's hidden facts (``UserFacts``): their name and SSN digits, the card or
charge the conversation is about, and why they dispute it. The agent only learns them by asking.

How a reply is chosen, given the agent's latest plain-text message:

1. If the goal is met (the episode checks the live database, or for "nothing to do" scenarios
   that the agent told the user so), the user says a closing phrase and the conversation ends.
2. Otherwise the message is split into sentences, and each sentence that is a question or a
   request (ends with '?', or says please / could you / provide / confirm ...) is matched against
   keyword patterns for five intents: ``identity`` (name, verify, SSN, "last four digits" not about
   a card), ``card`` (which card, card ending in ...), ``charge`` (which transaction, merchant,
   amount, date), ``reason`` (why, what happened) and ``confirm`` (shall I / do you want me to).
   Statements ("I have verified your identity.") ask nothing and trigger nothing.
3. The user answers every detected intent from the facts, in that fixed order, in one message;
   a question about something the scenario has no fact for gets a polite "that's not it".
4. A message that asks nothing gets the goal restated; after ``MAX_IDLE`` such turns in a row
   the user gives up and leaves.

Determinism matters more than realism here: the same transcript always gets the same replies, so
verification and episodes agree and a scripted agent can be tested end to end.
"""

from __future__ import annotations

import re
from typing import Any, Callable, TypedDict

MAX_IDLE = 3
CLOSING = "Great, that's everything I needed. Thank you, goodbye!"
NOTHING_TO_DO_CLOSING = "Oh, I see. Thanks for checking, goodbye!"
GIVE_UP = "This doesn't seem to be going anywhere. I'll call the branch instead. Goodbye."


class UserFacts(TypedDict, total=False):
    scenario: str
    name: str
    ssn_last4: str
    customer_id: int
    opening: str
    goal: str
    card: dict[str, Any] | None  # last4, kind, card_id
    charge: dict[str, Any] | None  # merchant, amount, date, spoken_date, transaction_id (None if absent)
    reason: str | None


REASON_PHRASES = {
    "unauthorized": "I never made that purchase. I don't recognize it at all.",
    "wrong_amount": "The amount is wrong: I was charged more than the price I agreed to.",
    "not_received": "I paid for the order but it never arrived.",
}

_REQUEST = re.compile(
    r"\?\s*$|\b(please|provide|could you|can you|would you|may i|tell me|let me know|share|confirm|"
    r"i need|i'll need|i will need)\b", re.I)
_CARD = re.compile(
    r"which card|what card|card (number|ending)|ending (in|with)|"
    r"(last (4|four) digits|number) (of|on) (the|your|that) card", re.I)
_IDENTITY = re.compile(r"\b(full )?name\b|identit|verif|\bssn\b|social security", re.I)
_LAST_FOUR = re.compile(r"last (4|four)\b", re.I)
_CHARGE = re.compile(
    r"which (charge|transaction|purchase|payment)|\b(merchant|amount|date)\b|how much|"
    r"when (was|did|were)|where (was|did)|(details|describe|tell me).{0,40}(charge|transaction|purchase)", re.I)
_REASON = re.compile(
    r"\breason\b|\bwhy\b|what happened|what went wrong|what('s| is) wrong|"
    r"(did|do) you (make|authorize|recognize)", re.I)
_CONFIRM = re.compile(
    r"(would|do) you (like|want) me to|shall i\b|should i\b|is that (correct|right|ok)|go ahead", re.I)

INTENT_ORDER = ("identity", "card", "charge", "reason", "confirm")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.?!])\s+|\n+", text) if s.strip()]


def detect_intents(agent_text: str) -> list[str]:
    """The intents the agent's message asks about, in ``INTENT_ORDER`` (pure; see module doc)."""
    found: set[str] = set()
    for s in _sentences(agent_text):
        if not _REQUEST.search(s):
            continue
        card = bool(_CARD.search(s))
        if card:
            found.add("card")
        if _IDENTITY.search(s) or (_LAST_FOUR.search(s) and not card):
            found.add("identity")
        if _CHARGE.search(s):
            found.add("charge")
        if _REASON.search(s):
            found.add("reason")
        if _CONFIRM.search(s):
            found.add("confirm")
    return [i for i in INTENT_ORDER if i in found]


def _answer_identity(f: UserFacts) -> str:
    return f"My name is {f['name']} and the last four digits of my SSN are {f['ssn_last4']}."


def _answer_card(f: UserFacts) -> str:
    card = f.get("card")
    if not card:
        return "This isn't about a specific card."
    return f"It's my {card['kind']} card ending in {card['last4']}."


def _answer_charge(f: UserFacts) -> str:
    charge = f.get("charge")
    if not charge:
        return "This isn't about a charge."
    return f"It's a charge of ${charge['amount']} at {charge['merchant']} on {charge['spoken_date']}."


def _answer_reason(f: UserFacts) -> str:
    reason = f.get("reason")
    return REASON_PHRASES[reason] if reason else f"I'm not sure. {f['goal']}"


def _answer_confirm(f: UserFacts) -> str:
    return "Yes, please go ahead."


ANSWERS: dict[str, Callable[[UserFacts], str]] = {
    "identity": _answer_identity, "card": _answer_card, "charge": _answer_charge, "reason": _answer_reason,
    "confirm": _answer_confirm,
}


class RuleBasedUser:
    """One conversation's simulated customer (stateful only in its idle-turn counter)."""

    def __init__(self, facts: UserFacts, closing: str = CLOSING) -> None:
        self.facts = facts
        self.closing = closing
        self.idle = 0

    def opening(self) -> str:
        return self.facts["opening"]

    def reply(self, agent_text: str, goal_met: bool) -> tuple[str, bool]:
        """(the user's message, whether the user has ended the conversation)."""
        if goal_met:
            return self.closing, True
        intents = detect_intents(agent_text)
        if intents:
            self.idle = 0
            return " ".join(ANSWERS[i](self.facts) for i in intents), False
        self.idle += 1
        if self.idle >= MAX_IDLE:
            return GIVE_UP, True
        return self.facts["goal"], False
