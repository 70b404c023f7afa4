"""The 26 tools of the workplace assistant, over the database of ``data.py``.

Each tool is a plain function ``fn(db, **arguments)`` registered in ``TOOLBOX`` with a JSON schema;
the schema is checked before the function runs (see ``posttrain/envs/tools.py``), so functions only
check what a schema cannot say (does this id exist, is there anything to update).

Conventions the model sees in the descriptions: dates are ``YYYY-MM-DD``, times ``YYYY-MM-DD HH:MM``
(24-hour), people are addressed by email (``directory_search`` finds them), searches return at most
``limit`` rows. Writes are deterministic: a sent email is stamped with the world's "now", new rows get
the next id from ``NEW_ID_BASE`` up, and attendee lists are stored sorted without the user, so the
same intent written in a different order leads to the same state.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from posttrain.envs.tools import Toolbox, ToolError, next_id
from posttrain.envs.workplace.data import (
    CUSTOMER_STATUSES, LOCATIONS, METRICS, PRIORITIES, PROJECTS, REGIONS, TASK_STATUSES, TEAMS, WorkplaceDB,
)

TOOLBOX = Toolbox("workplace")

EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "date, YYYY-MM-DD"}
DATETIME = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}$",
            "description": "date and time, YYYY-MM-DD HH:MM (24-hour)"}
EMAIL = {"type": "string", "pattern": EMAIL_PATTERN, "description": "an email address"}
LIMIT = {"type": "integer", "minimum": 1, "maximum": 50, "description": "maximum number of results (default 10)"}
ID = {"type": "integer", "minimum": 1}


def _id(description: str) -> dict[str, Any]:
    return {**ID, "description": description}


def _text(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": description}


def _enum(values: list[str], description: str) -> dict[str, Any]:
    return {"type": "string", "enum": values, "description": description}


def _rows(db: WorkplaceDB, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    return [dict(r) for r in db.conn.execute(sql, params).fetchall()]


def _one(db: WorkplaceDB, table: str, row_id: int, what: str) -> dict[str, Any]:
    row = db.conn.execute(f"SELECT * FROM {table} WHERE id = ?", [row_id]).fetchone()
    if row is None:
        raise ToolError("not_found", f"no {what} with id {row_id}")
    return dict(row)


def _where(filters: list[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """A WHERE clause from (sql condition, value) pairs; a None value drops its condition, and the
    value fills every ``?`` of its condition."""
    used = [(cond, val) for cond, val in filters if val is not None]
    if not used:
        return "", []
    return " WHERE " + " AND ".join(c for c, _ in used), [v for c, v in used for _ in range(c.count("?"))]


def _like(s: str | None) -> str | None:
    return None if s is None else f"%{s.lower()}%"


def _parse_datetime(s: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(s, "%Y-%m-%d %H:%M")
    except ValueError:
        raise ToolError("bad_argument_value", f"{s!r} is not a valid date and time") from None


def _check_date(s: str) -> str:
    try:
        dt.date.fromisoformat(s)
    except ValueError:
        raise ToolError("bad_argument_value", f"{s!r} is not a valid date") from None
    return s


def _attendees(db: WorkplaceDB, emails: list[str]) -> str:
    me = db.world.user["email"]
    return ",".join(sorted({e.strip().lower() for e in emails} - {me}))


def _event_out(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "attendees": row["attendees"].split(",") if row["attendees"] else []}


def _update(db: WorkplaceDB, table: str, row_id: int, changes: dict[str, Any], what: str) -> dict[str, Any]:
    _one(db, table, row_id, what)
    fields = {k: v for k, v in changes.items() if v is not None}
    if not fields:
        raise ToolError("nothing_to_update", f"give at least one field of the {what} to change")
    db.conn.execute(f"UPDATE {table} SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                    [*fields.values(), row_id])
    return _one(db, table, row_id, what)


def _delete(db: WorkplaceDB, table: str, row_id: int, what: str) -> dict[str, Any]:
    _one(db, table, row_id, what)
    db.conn.execute(f"DELETE FROM {table} WHERE id = ?", [row_id])
    return {"deleted": row_id}


def _insert(db: WorkplaceDB, table: str, row: dict[str, Any]) -> int:
    row_id = next_id(db.conn, table, "id")
    cols = ["id", *row]
    db.conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [row_id, *row.values()])
    return row_id


# --------------------------------------------------------------------------- directory


@TOOLBOX.tool(
    "Find colleagues in the company directory by (part of) their name and/or team. Returns name, email, "
    "team and role.",
    {"name": _text("part of the person's name, case-insensitive"), "team": _enum(TEAMS, "team"), "limit": LIMIT},
    optional=("name", "team", "limit"),
)
def directory_search(db: WorkplaceDB, name: str | None = None, team: str | None = None, limit: int = 10):
    where, params = _where([("LOWER(name) LIKE ?", _like(name)), ("team = ?", team)])
    return _rows(db, f"SELECT name, email, team, role FROM employees{where} ORDER BY name LIMIT ?", [*params, limit])


# --------------------------------------------------------------------------- email


@TOOLBOX.tool(
    "Search the user's mailbox (received and sent mail), newest first. Returns id, sender, recipient, "
    "subject and sent_at; use email_get for the body.",
    {"query": _text("text that must appear in the subject or body"), "sender": EMAIL, "recipient": EMAIL,
     "after": {**DATE, "description": "only emails sent on or after this date (YYYY-MM-DD)"},
     "before": {**DATE, "description": "only emails sent before this date (YYYY-MM-DD)"}, "limit": LIMIT},
    optional=("query", "sender", "recipient", "after", "before", "limit"),
)
def email_search(db: WorkplaceDB, query: str | None = None, sender: str | None = None, recipient: str | None = None,
                 after: str | None = None, before: str | None = None, limit: int = 10):
    where, params = _where([
        ("(LOWER(subject) LIKE ? OR LOWER(body) LIKE ?)", _like(query)),
        ("sender = ?", sender and sender.lower()), ("recipient = ?", recipient and recipient.lower()),
        ("sent_at >= ?", after), ("sent_at < ?", before),
    ])
    return _rows(db, f"SELECT id, sender, recipient, subject, sent_at FROM emails{where} "
                     "ORDER BY sent_at DESC LIMIT ?", [*params, limit])


@TOOLBOX.tool("Read one email in full.", {"email_id": _id("id of the email")})
def email_get(db: WorkplaceDB, email_id: int):
    return _one(db, "emails", email_id, "email")


def _send(db: WorkplaceDB, recipient: str, subject: str, body: str) -> dict[str, Any]:
    row_id = _insert(db, "emails", {"sender": db.world.user["email"], "recipient": recipient.lower(),
                                    "subject": subject, "body": body, "sent_at": db.world.now})
    return {"email_id": row_id, "status": "sent"}


@TOOLBOX.tool(
    "Send a new email from the user to one recipient.",
    {"recipient": EMAIL, "subject": _text("subject line"), "body": _text("message text")},
)
def email_send(db: WorkplaceDB, recipient: str, subject: str, body: str):
    return _send(db, recipient, subject, body)


@TOOLBOX.tool(
    "Reply to an email: sends `body` to the other party of that email with the subject 'Re: <subject>'.",
    {"email_id": _id("id of the email to reply to"), "body": _text("reply text")},
)
def email_reply(db: WorkplaceDB, email_id: int, body: str):
    original = _one(db, "emails", email_id, "email")
    me = db.world.user["email"]
    to = original["recipient"] if original["sender"] == me else original["sender"]
    subject = original["subject"]
    return _send(db, to, subject if subject.lower().startswith("re:") else f"Re: {subject}", body)


@TOOLBOX.tool(
    "Forward an email unchanged to a recipient, with the subject 'Fwd: <subject>'.",
    {"email_id": _id("id of the email to forward"), "recipient": EMAIL},
)
def email_forward(db: WorkplaceDB, email_id: int, recipient: str):
    original = _one(db, "emails", email_id, "email")
    return _send(db, recipient, f"Fwd: {original['subject']}", original["body"])


@TOOLBOX.tool("Delete an email from the mailbox.", {"email_id": _id("id of the email to delete")})
def email_delete(db: WorkplaceDB, email_id: int):
    return _delete(db, "emails", email_id, "email")


# --------------------------------------------------------------------------- calendar


@TOOLBOX.tool(
    "Search the user's calendar, earliest first. `attendee` matches one attendee's email; `date` a whole "
    "day; `start_after`/`start_before` bound the start time.",
    {"query": _text("text that must appear in the title"), "attendee": EMAIL, "date": DATE,
     "start_after": DATETIME, "start_before": DATETIME, "limit": LIMIT},
    optional=("query", "attendee", "date", "start_after", "start_before", "limit"),
)
def calendar_search(db: WorkplaceDB, query: str | None = None, attendee: str | None = None, date: str | None = None,
                    start_after: str | None = None, start_before: str | None = None, limit: int = 10):
    where, params = _where([
        ("LOWER(title) LIKE ?", _like(query)),
        ("(',' || attendees || ',') LIKE ?", attendee and f"%,{attendee.lower()},%"),
        ("substr(start, 1, 10) = ?", date), ("start >= ?", start_after), ("start < ?", start_before),
    ])
    return [_event_out(r) for r in _rows(db, f"SELECT * FROM events{where} ORDER BY start, id LIMIT ?",
                                         [*params, limit])]


@TOOLBOX.tool("Get one calendar event.", {"event_id": _id("id of the event")})
def calendar_get_event(db: WorkplaceDB, event_id: int):
    return _event_out(_one(db, "events", event_id, "event"))


ATTENDEES = {"type": "array", "items": EMAIL, "description": "emails of the attendees other than the user"}
DURATION = {"type": "integer", "minimum": 5, "maximum": 480, "description": "length in minutes"}
LOCATION = _enum(LOCATIONS, "where the meeting takes place")


@TOOLBOX.tool(
    "Create a calendar event for the user.",
    {"title": _text("event title"), "start": DATETIME, "duration_minutes": DURATION, "attendees": ATTENDEES,
     "location": LOCATION},
    optional=("location",),
)
def calendar_create_event(db: WorkplaceDB, title: str, start: str, duration_minutes: int, attendees: list[str],
                          location: str = "Zoom"):
    _parse_datetime(start)
    row_id = _insert(db, "events", {"title": title, "start": start, "duration_minutes": duration_minutes,
                                    "attendees": _attendees(db, attendees), "location": location})
    return {"event_id": row_id, "status": "created"}


@TOOLBOX.tool(
    "Change fields of a calendar event (give only the fields to change).",
    {"event_id": _id("id of the event"), "title": _text("new title"), "start": DATETIME,
     "duration_minutes": DURATION, "attendees": ATTENDEES, "location": LOCATION},
    optional=("title", "start", "duration_minutes", "attendees", "location"),
)
def calendar_update_event(db: WorkplaceDB, event_id: int, title: str | None = None, start: str | None = None,
                          duration_minutes: int | None = None, attendees: list[str] | None = None,
                          location: str | None = None):
    if start is not None:
        _parse_datetime(start)
    joined = None if attendees is None else _attendees(db, attendees)
    row = _update(db, "events", event_id, {"title": title, "start": start, "duration_minutes": duration_minutes,
                                           "attendees": joined, "location": location}, "event")
    return _event_out(row)


@TOOLBOX.tool("Delete (cancel) a calendar event.", {"event_id": _id("id of the event")})
def calendar_delete_event(db: WorkplaceDB, event_id: int):
    return _delete(db, "events", event_id, "event")


@TOOLBOX.tool(
    "List free start times (on the half hour, 09:00-17:00) on a day where a meeting of the given length "
    "would not overlap any event.",
    {"date": DATE, "duration_minutes": DURATION},
)
def calendar_find_free_slots(db: WorkplaceDB, date: str, duration_minutes: int):
    day = dt.date.fromisoformat(_check_date(date))
    busy = [(_parse_datetime(r["start"]), r["duration_minutes"])
            for r in _rows(db, "SELECT start, duration_minutes FROM events WHERE substr(start, 1, 10) = ?", [date])]
    slots = []
    t = dt.datetime.combine(day, dt.time(9, 0))
    end_of_day = dt.datetime.combine(day, dt.time(17, 0))
    length = dt.timedelta(minutes=duration_minutes)
    while t + length <= end_of_day:
        if all(t + length <= s or t >= s + dt.timedelta(minutes=d) for s, d in busy):
            slots.append(t.strftime("%Y-%m-%d %H:%M"))
        t += dt.timedelta(minutes=30)
    return slots


# --------------------------------------------------------------------------- CRM


@TOOLBOX.tool(
    "Search customer accounts. `sort_by` orders the results (default: company name).",
    {"company": _text("part of the company name"), "region": _enum(REGIONS, "sales region"),
     "status": _enum(CUSTOMER_STATUSES, "account status"), "assigned_to": EMAIL,
     "sort_by": _enum(["company", "revenue_desc", "revenue_asc", "last_contact_desc", "last_contact_asc"],
                      "result order"), "limit": LIMIT},
    optional=("company", "region", "status", "assigned_to", "sort_by", "limit"),
)
def crm_search_customers(db: WorkplaceDB, company: str | None = None, region: str | None = None,
                         status: str | None = None, assigned_to: str | None = None, sort_by: str = "company",
                         limit: int = 10):
    order = {"company": "company", "revenue_desc": "revenue DESC", "revenue_asc": "revenue",
             "last_contact_desc": "last_contact DESC", "last_contact_asc": "last_contact"}[sort_by]
    where, params = _where([("LOWER(company) LIKE ?", _like(company)), ("region = ?", region),
                            ("status = ?", status), ("assigned_to = ?", assigned_to and assigned_to.lower())])
    return _rows(db, f"SELECT * FROM customers{where} ORDER BY {order}, id LIMIT ?", [*params, limit])


@TOOLBOX.tool("Get one customer account.", {"customer_id": _id("id of the customer")})
def crm_get_customer(db: WorkplaceDB, customer_id: int):
    return _one(db, "customers", customer_id, "customer")


@TOOLBOX.tool(
    "Add a customer account. Revenue defaults to 0; last_contact is set to today.",
    {"company": _text("company name"), "contact_name": _text("full name of the contact person"),
     "contact_email": EMAIL, "region": _enum(REGIONS, "sales region"),
     "status": _enum(CUSTOMER_STATUSES, "account status"), "assigned_to": EMAIL,
     "revenue": {"type": "integer", "minimum": 0, "description": "annual revenue in dollars"}},
    optional=("revenue",),
)
def crm_add_customer(db: WorkplaceDB, company: str, contact_name: str, contact_email: str, region: str, status: str,
                     assigned_to: str, revenue: int = 0):
    row_id = _insert(db, "customers", {
        "company": company, "contact_name": contact_name, "contact_email": contact_email.lower(), "region": region,
        "status": status, "revenue": revenue, "assigned_to": assigned_to.lower(),
        "last_contact": db.world.today.isoformat(), "notes": ""})
    return {"customer_id": row_id, "status": "created"}


@TOOLBOX.tool(
    "Change fields of a customer account (give only the fields to change).",
    {"customer_id": _id("id of the customer"), "status": _enum(CUSTOMER_STATUSES, "account status"),
     "assigned_to": EMAIL, "region": _enum(REGIONS, "sales region"), "contact_email": EMAIL,
     "last_contact": DATE, "notes": {"type": "string", "description": "free-text notes (replaces the old ones)"}},
    optional=("status", "assigned_to", "region", "contact_email", "last_contact", "notes"),
)
def crm_update_customer(db: WorkplaceDB, customer_id: int, status: str | None = None, assigned_to: str | None = None,
                        region: str | None = None, contact_email: str | None = None, last_contact: str | None = None,
                        notes: str | None = None):
    changes = {"status": status, "assigned_to": assigned_to and assigned_to.lower(), "region": region,
               "contact_email": contact_email and contact_email.lower(),
               "last_contact": last_contact and _check_date(last_contact), "notes": notes}
    return _update(db, "customers", customer_id, changes, "customer")


@TOOLBOX.tool("Delete a customer account.", {"customer_id": _id("id of the customer")})
def crm_delete_customer(db: WorkplaceDB, customer_id: int):
    return _delete(db, "customers", customer_id, "customer")


# --------------------------------------------------------------------------- projects


@TOOLBOX.tool("List the projects with their number of tasks per status.", {})
def project_list_projects(db: WorkplaceDB):
    rows = _rows(db, "SELECT project, status, COUNT(*) AS n FROM tasks GROUP BY project, status", [])
    out: dict[str, dict[str, int]] = {p: {s: 0 for s in TASK_STATUSES} for p in PROJECTS}
    for r in rows:
        out[r["project"]][r["status"]] = r["n"]
    return [{"project": p, **counts} for p, counts in out.items()]


PROJECT = _enum(PROJECTS, "project name")
TASK_STATUS = _enum(TASK_STATUSES, "task status")
PRIORITY = _enum(PRIORITIES, "priority")


@TOOLBOX.tool(
    "Search project tasks, ordered by due date. `due_before` keeps tasks due strictly before that date.",
    {"project": PROJECT, "assignee": EMAIL, "status": TASK_STATUS, "title": _text("part of the task title"),
     "due_before": DATE, "limit": LIMIT},
    optional=("project", "assignee", "status", "title", "due_before", "limit"),
)
def project_search_tasks(db: WorkplaceDB, project: str | None = None, assignee: str | None = None,
                         status: str | None = None, title: str | None = None, due_before: str | None = None,
                         limit: int = 10):
    where, params = _where([("project = ?", project), ("assignee = ?", assignee and assignee.lower()),
                            ("status = ?", status), ("LOWER(title) LIKE ?", _like(title)),
                            ("due_date < ?", due_before)])
    return _rows(db, f"SELECT * FROM tasks{where} ORDER BY due_date, id LIMIT ?", [*params, limit])


@TOOLBOX.tool(
    "Create a task (status 'todo'; priority defaults to 'medium').",
    {"project": PROJECT, "title": _text("task title"), "assignee": EMAIL, "due_date": DATE, "priority": PRIORITY},
    optional=("priority",),
)
def project_create_task(db: WorkplaceDB, project: str, title: str, assignee: str, due_date: str,
                        priority: str = "medium"):
    row_id = _insert(db, "tasks", {"project": project, "title": title, "assignee": assignee.lower(),
                                   "status": "todo", "due_date": _check_date(due_date), "priority": priority})
    return {"task_id": row_id, "status": "created"}


@TOOLBOX.tool(
    "Change fields of a task (give only the fields to change).",
    {"task_id": _id("id of the task"), "status": TASK_STATUS, "assignee": EMAIL, "due_date": DATE,
     "priority": PRIORITY, "title": _text("new title")},
    optional=("status", "assignee", "due_date", "priority", "title"),
)
def project_update_task(db: WorkplaceDB, task_id: int, status: str | None = None, assignee: str | None = None,
                        due_date: str | None = None, priority: str | None = None, title: str | None = None):
    changes = {"status": status, "assignee": assignee and assignee.lower(),
               "due_date": due_date and _check_date(due_date), "priority": priority, "title": title}
    return _update(db, "tasks", task_id, changes, "task")


@TOOLBOX.tool("Delete a task.", {"task_id": _id("id of the task")})
def project_delete_task(db: WorkplaceDB, task_id: int):
    return _delete(db, "tasks", task_id, "task")


# --------------------------------------------------------------------------- analytics

METRIC = _enum(list(METRICS), "metric name")


def _metric_range(db: WorkplaceDB, metric: str, start_date: str, end_date: str) -> list[dict[str, Any]]:
    _check_date(start_date), _check_date(end_date)
    if start_date > end_date:
        raise ToolError("bad_argument_value", "start_date is after end_date")
    rows = _rows(db, "SELECT date, value FROM metrics WHERE metric = ? AND date BETWEEN ? AND ? ORDER BY date",
                 [metric, start_date, end_date])
    if not rows:
        raise ToolError("not_found", f"no {metric} data between {start_date} and {end_date}")
    return rows


@TOOLBOX.tool("List the available metrics and the dates they cover.", {})
def analytics_list_metrics(db: WorkplaceDB):
    return _rows(db, "SELECT metric, MIN(date) AS first_date, MAX(date) AS last_date FROM metrics GROUP BY metric",
                 [])


@TOOLBOX.tool(
    "Aggregate a daily metric over a date range (both ends included). Average is rounded to 2 decimals.",
    {"metric": METRIC, "start_date": DATE, "end_date": DATE,
     "aggregate": _enum(["sum", "average", "min", "max"], "how to combine the daily values")},
)
def analytics_get_metric(db: WorkplaceDB, metric: str, start_date: str, end_date: str, aggregate: str):
    values = [r["value"] for r in _metric_range(db, metric, start_date, end_date)]
    combine = {"sum": sum, "min": min, "max": max, "average": lambda v: round(sum(v) / len(v), 2)}[aggregate]
    return {"metric": metric, "aggregate": aggregate, "start_date": start_date, "end_date": end_date,
            "days": len(values), "value": combine(values)}


@TOOLBOX.tool(
    "The daily values of a metric over a date range (both ends included).",
    {"metric": METRIC, "start_date": DATE, "end_date": DATE},
)
def analytics_daily_values(db: WorkplaceDB, metric: str, start_date: str, end_date: str):
    return _metric_range(db, metric, start_date, end_date)
