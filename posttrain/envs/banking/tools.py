"""The tools of the banking agent (8 of them), over the database of ``data.py``.

The tools do not enforce the bank's policy ("verify identity first"); like a real back office
they let an agent act and keep an audit trail (``actions``). The policy lives in the system
prompt and is graded through the state: an action taken for an unverified customer is logged with
``verified = 0`` and can never match the reference, whose actions all follow a verification.
What the tools do refuse is what no policy could allow: unblocking a card that is not blocked or
was reported lost, disputing the same transaction twice, verifying a locked customer.
"""

from __future__ import annotations

from typing import Any

from posttrain.envs.banking.data import (
    BLOCK_REASONS, DISPUTE_REASONS, MAX_FAILED_VERIFICATIONS, UNBLOCKABLE, BankDB, format_amount,
)
from posttrain.envs.tools import Toolbox, ToolError, next_id

TOOLBOX = Toolbox("banking")

ID = {"type": "integer", "minimum": 1}
DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "date, YYYY-MM-DD"}


def _id(description: str) -> dict[str, Any]:
    return {**ID, "description": description}


def _row(db: BankDB, sql: str, params: list[Any], missing: str) -> dict[str, Any]:
    row = db.conn.execute(sql, params).fetchone()
    if row is None:
        raise ToolError("not_found", missing)
    return dict(row)


def _customer(db: BankDB, customer_id: int) -> dict[str, Any]:
    return _row(db, "SELECT * FROM customers WHERE id = ?", [customer_id], f"no customer with id {customer_id}")


def _card(db: BankDB, card_id: int) -> dict[str, Any]:
    return _row(db, "SELECT * FROM cards WHERE id = ?", [card_id], f"no card with id {card_id}")


def is_verified(db: BankDB, customer_id: int) -> bool:
    row = db.conn.execute("SELECT verified FROM sessions WHERE customer_id = ?", [customer_id]).fetchone()
    return bool(row and row["verified"])


def _log(db: BankDB, tool: str, customer_id: int, target: int) -> None:
    db.conn.execute("INSERT INTO actions (tool, customer_id, target, verified) VALUES (?, ?, ?, ?)",
                    [tool, customer_id, target, int(is_verified(db, customer_id))])


def _card_out(card: dict[str, Any]) -> dict[str, Any]:
    return {"card_id": card["id"], "last4": card["last4"], "kind": card["kind"], "status": card["status"],
            "block_reason": card["block_reason"]}


@TOOLBOX.tool(
    "Find customers by full or partial name and/or email. Returns customer_id, name and city.",
    {"name": {"type": "string", "minLength": 2, "description": "part of the customer's name"},
     "email": {"type": "string", "minLength": 3, "description": "the customer's email address"}},
    optional=("name", "email"),
)
def lookup_customer(db: BankDB, name: str | None = None, email: str | None = None):
    if name is None and email is None:
        raise ToolError("missing_argument", "give a name or an email")
    sql, params = "SELECT id, name, city FROM customers WHERE 1 = 1", []
    if name is not None:
        sql, params = sql + " AND LOWER(name) LIKE ?", params + [f"%{name.strip().lower()}%"]
    if email is not None:
        sql, params = sql + " AND email = ?", params + [email.strip().lower()]
    rows = db.conn.execute(sql + " ORDER BY id LIMIT 10", params).fetchall()
    return [{"customer_id": r["id"], "name": r["name"], "city": r["city"]} for r in rows]


@TOOLBOX.tool(
    "Verify a customer's identity with the last four digits of their Social Security number, as the "
    f"customer states them. {MAX_FAILED_VERIFICATIONS} failed attempts lock the customer's profile.",
    {"customer_id": _id("id from lookup_customer"),
     "ssn_last4": {"type": "string", "pattern": r"^\d{4}$", "description": "four digits"}},
)
def verify_identity(db: BankDB, customer_id: int, ssn_last4: str):
    customer = _customer(db, customer_id)
    if customer["locked"]:
        raise ToolError("customer_locked", "this profile is locked after failed verifications")
    if is_verified(db, customer_id):
        return {"verified": True, "note": "already verified in this conversation"}
    session = db.conn.execute("SELECT failed_attempts FROM sessions WHERE customer_id = ?", [customer_id]).fetchone()
    failed = session["failed_attempts"] if session else 0
    if ssn_last4 == customer["ssn_last4"]:
        db.conn.execute("INSERT OR REPLACE INTO sessions VALUES (?, 1, ?)", [customer_id, failed])
        _log(db, "verify_identity", customer_id, customer_id)
        return {"verified": True}
    failed += 1
    db.conn.execute("INSERT OR REPLACE INTO sessions VALUES (?, 0, ?)", [customer_id, failed])
    if failed >= MAX_FAILED_VERIFICATIONS:
        db.conn.execute("UPDATE customers SET locked = 1 WHERE id = ?", [customer_id])
        return {"verified": False, "locked": True}
    return {"verified": False, "attempts_left": MAX_FAILED_VERIFICATIONS - failed}


@TOOLBOX.tool("List a customer's cards with their status.", {"customer_id": _id("id of the customer")})
def list_cards(db: BankDB, customer_id: int):
    _customer(db, customer_id)
    rows = db.conn.execute("SELECT * FROM cards WHERE customer_id = ? ORDER BY id", [customer_id]).fetchall()
    return [_card_out(dict(r)) for r in rows]


@TOOLBOX.tool(
    "Unblock a blocked card. Cards blocked because they were reported lost cannot be unblocked.",
    {"card_id": _id("id from list_cards")},
)
def unblock_card(db: BankDB, card_id: int):
    card = _card(db, card_id)
    if card["status"] != "blocked":
        raise ToolError("card_not_blocked", f"card {card_id} is {card['status']}, not blocked")
    if card["block_reason"] not in UNBLOCKABLE:
        raise ToolError("card_reported_lost", f"card {card_id} was reported lost and cannot be unblocked")
    db.conn.execute("UPDATE cards SET status = 'active', block_reason = NULL WHERE id = ?", [card_id])
    _log(db, "unblock_card", card["customer_id"], card_id)
    return _card_out(_card(db, card_id))


@TOOLBOX.tool(
    "Block a card, e.g. when the customer reports it lost.",
    {"card_id": _id("id from list_cards"),
     "reason": {"type": "string", "enum": BLOCK_REASONS, "description": "why the card is blocked"}},
)
def block_card(db: BankDB, card_id: int, reason: str):
    card = _card(db, card_id)
    if card["status"] == "blocked":
        raise ToolError("card_already_blocked", f"card {card_id} is already blocked")
    db.conn.execute("UPDATE cards SET status = 'blocked', block_reason = ? WHERE id = ?", [reason, card_id])
    _log(db, "block_card", card["customer_id"], card_id)
    return _card_out(_card(db, card_id))


@TOOLBOX.tool(
    "List a customer's card transactions, newest first, optionally filtered by merchant (partial name) "
    "and date range (both ends included). Amounts are in dollars.",
    {"customer_id": _id("id of the customer"),
     "merchant": {"type": "string", "minLength": 2, "description": "part of the merchant name"},
     "date_from": DATE, "date_to": DATE},
    optional=("merchant", "date_from", "date_to"),
)
def list_transactions(db: BankDB, customer_id: int, merchant: str | None = None, date_from: str | None = None,
                      date_to: str | None = None):
    _customer(db, customer_id)
    sql = ("SELECT t.id, t.date, t.merchant, t.amount_cents, c.last4 FROM transactions t "
           "JOIN cards c ON c.id = t.card_id WHERE c.customer_id = ?")
    params: list[Any] = [customer_id]
    for cond, value in (("LOWER(t.merchant) LIKE ?", merchant and f"%{merchant.lower()}%"),
                        ("t.date >= ?", date_from), ("t.date <= ?", date_to)):
        if value is not None:
            sql, params = f"{sql} AND {cond}", params + [value]
    rows = db.conn.execute(sql + " ORDER BY t.date DESC, t.id LIMIT 50", params).fetchall()
    return [{"transaction_id": r["id"], "date": r["date"], "merchant": r["merchant"],
             "amount": format_amount(r["amount_cents"]), "card_last4": r["last4"]} for r in rows]


@TOOLBOX.tool(
    "File a dispute for one transaction. reason: 'unauthorized' (the customer did not make the purchase), "
    "'wrong_amount' (charged a different amount than agreed), 'not_received' (paid, goods never arrived).",
    {"transaction_id": _id("id from list_transactions"),
     "reason": {"type": "string", "enum": DISPUTE_REASONS, "description": "dispute reason"},
     "description": {"type": "string", "description": "the customer's account of what happened"}},
    optional=("description",),
)
def file_dispute(db: BankDB, transaction_id: int, reason: str, description: str = ""):
    txn = _row(db, "SELECT t.id, c.customer_id FROM transactions t JOIN cards c ON c.id = t.card_id WHERE t.id = ?",
               [transaction_id], f"no transaction with id {transaction_id}")
    if db.conn.execute("SELECT 1 FROM disputes WHERE transaction_id = ?", [transaction_id]).fetchone():
        raise ToolError("already_disputed", f"transaction {transaction_id} already has a dispute")
    dispute_id = next_id(db.conn, "disputes", "id")
    db.conn.execute("INSERT INTO disputes VALUES (?, ?, ?, 'open', ?)",
                    [dispute_id, transaction_id, reason, description])
    _log(db, "file_dispute", txn["customer_id"], transaction_id)
    return {"dispute_id": dispute_id, "transaction_id": transaction_id, "reason": reason, "status": "open"}


@TOOLBOX.tool("List the disputes filed for a customer's transactions.", {"customer_id": _id("id of the customer")})
def list_disputes(db: BankDB, customer_id: int):
    _customer(db, customer_id)
    rows = db.conn.execute(
        "SELECT d.id, d.transaction_id, d.reason, d.status FROM disputes d "
        "JOIN transactions t ON t.id = d.transaction_id JOIN cards c ON c.id = t.card_id "
        "WHERE c.customer_id = ? ORDER BY d.id", [customer_id]).fetchall()
    return [{"dispute_id": r["id"], "transaction_id": r["transaction_id"], "reason": r["reason"],
             "status": r["status"]} for r in rows]
