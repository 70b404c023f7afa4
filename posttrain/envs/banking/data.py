"""The generated bank behind the banking environment: customers, cards, transactions, disputes.

``generate_world(seed)`` draws a small bank from word lists with ``random.Random``; ``build_db``
loads it into a fresh in-memory SQLite database, which the verifier rebuilds from the seed alone.

Two tables exist only to make the policy checkable from the database state:

* ``sessions``: which customers this conversation has verified, and failed verification attempts
  (three failures lock the customer, which is state and so costs the reward: guessing SSN digits
  is not a strategy);
* ``actions``: an append-only log of every state-changing call (verification, unblock, block,
  dispute) with whether the customer involved was verified at that moment. The log is compared
  as an ordered sequence, so "unblock, then verify" differs from "verify, then unblock" although
  both end with an active card: an unauthorized action is visible in the final state.

Seed customers, cards and transactions have ids below ``NEW_ID_BASE``; disputes filed during an
episode get ids from there up and are compared without them.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from posttrain.envs.tools import TableSpec

Row = dict[str, Any]

FIRST_NAMES = [
    "Alice", "Bruno", "Carmen", "Dmitri", "Esther", "Felix", "Gloria", "Hamid", "Irene", "Jonas", "Kavya",
    "Luis", "Marta", "Nikhil", "Oscar", "Paula", "Rafael", "Sofia", "Tomas", "Ursula", "Victor", "Wendy",
    "Yara", "Zane",
]
LAST_NAMES = [
    "Abbott", "Bennett", "Castillo", "Donovan", "Eriksen", "Fontaine", "Gallagher", "Horvat", "Iverson",
    "Jovanovic", "Kowalski", "Lindqvist", "Mendes", "Nakamura", "Olsen", "Petrov", "Ramirez", "Sorensen",
    "Thornton", "Valdez", "Whitaker", "Yamada",
]
CITIES = ["Springfield", "Riverton", "Lakeside", "Fairview", "Greenville", "Milford", "Ashland", "Clayton"]
MERCHANTS = [
    "Corner Coffee", "FreshMart Groceries", "QuickFuel", "ShopZone Online", "StreamFlix", "RideNow",
    "MegaMart", "SkyWays Airlines", "Gadget Store", "TuneBox Music", "BuildIt Hardware", "CityPharmacy",
    "Burrito Bar", "PageTurner Books", "FitLife Gym",
]
CARD_KINDS = ["debit", "credit"]
BLOCK_REASONS = ["suspicious_activity", "too_many_pin_attempts", "reported_lost"]
UNBLOCKABLE = ("suspicious_activity", "too_many_pin_attempts")
DISPUTE_REASONS = ["unauthorized", "wrong_amount", "not_received"]
N_CUSTOMERS = 30
TXNS_PER_CARD = (8, 16)
HISTORY_DAYS = 60
MAX_FAILED_VERIFICATIONS = 3

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, email TEXT, city TEXT, ssn_last4 TEXT,
                        locked INTEGER DEFAULT 0);
CREATE TABLE cards (id INTEGER PRIMARY KEY, customer_id INTEGER, last4 TEXT, kind TEXT, status TEXT,
                    block_reason TEXT);
CREATE TABLE transactions (id INTEGER PRIMARY KEY, card_id INTEGER, date TEXT, merchant TEXT,
                           amount_cents INTEGER);
CREATE TABLE disputes (id INTEGER PRIMARY KEY, transaction_id INTEGER, reason TEXT, status TEXT,
                       description TEXT);
CREATE TABLE sessions (customer_id INTEGER PRIMARY KEY, verified INTEGER, failed_attempts INTEGER);
CREATE TABLE actions (seq INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT, customer_id INTEGER,
                      target INTEGER, verified INTEGER);
"""

# The graded state: lock flags, card statuses, disputes (without their free-text description)
# and the ordered action log. Sessions' failure counters are left out on purpose: one mistyped
# SSN that the customer then corrects is not a failure of the task.
STATE_SPECS = (
    TableSpec("customers", "id", ("locked",)),
    TableSpec("cards", "id", ("status", "block_reason")),
    TableSpec("disputes", "id", ("transaction_id", "reason", "status")),
    TableSpec("actions", "seq", ("tool", "customer_id", "target", "verified"), ordered=True),
)


@dataclass(frozen=True)
class World:
    seed: int
    today: dt.date
    customers: list[Row]
    cards: list[Row]
    transactions: list[Row]

    def customer(self, customer_id: int) -> Row:
        return next(c for c in self.customers if c["id"] == customer_id)

    def cards_of(self, customer_id: int) -> list[Row]:
        return [c for c in self.cards if c["customer_id"] == customer_id]

    def transactions_of(self, customer_id: int) -> list[Row]:
        card_ids = {c["id"] for c in self.cards_of(customer_id)}
        return [t for t in self.transactions if t["card_id"] in card_ids]


def format_amount(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


@lru_cache(maxsize=128)
def generate_world(seed: int) -> World:
    """The bank of world ``seed`` (cached; treat the result as read-only)."""
    rng = random.Random(f"banking-world:{seed}")
    today = dt.date(2024, 1, 1) + dt.timedelta(days=rng.randrange(366))
    names = rng.sample([(f, l) for f in FIRST_NAMES for l in LAST_NAMES], N_CUSTOMERS)
    customers, cards, txns = [], [], []
    for i, (first, last) in enumerate(names):
        cid = i + 1
        customers.append({"id": cid, "name": f"{first} {last}", "email": f"{first}.{last}@mail.com".lower(),
                          "city": rng.choice(CITIES), "ssn_last4": f"{rng.randrange(10000):04d}", "locked": 0})
        for last4 in rng.sample(range(1000, 10000), rng.choice([1, 2, 2, 3])):
            blocked = rng.random() < 0.4  # many blocked cards, so every scenario finds candidates
            cards.append({"id": len(cards) + 1, "customer_id": cid, "last4": str(last4),
                          "kind": rng.choice(CARD_KINDS), "status": "blocked" if blocked else "active",
                          "block_reason": rng.choice(BLOCK_REASONS) if blocked else None})
            for _ in range(rng.randint(*TXNS_PER_CARD)):
                date = today - dt.timedelta(days=rng.randint(1, HISTORY_DAYS))
                txns.append({"id": len(txns) + 1, "card_id": len(cards), "date": date.isoformat(),
                             "merchant": rng.choice(MERCHANTS), "amount_cents": rng.randint(300, 25000)})
    return World(seed, today, customers, cards, txns)


class BankDB:
    """A live bank database plus the world it was built from."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.conn = sqlite3.connect(":memory:")
        self.conn.row_factory = sqlite3.Row
        self.conn.executescript(SCHEMA)
        for table, rows in (("customers", world.customers), ("cards", world.cards),
                            ("transactions", world.transactions)):
            cols = list(rows[0])
            self.conn.executemany(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [tuple(r[c] for c in cols) for r in rows])
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def build_db(seed: int) -> BankDB:
    return BankDB(generate_world(seed))
