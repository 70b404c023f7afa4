"""The procedurally generated company behind the workplace environment.

``generate_world(seed)`` draws one small company from a seed: a directory of employees, the user's
mailbox, their calendar, a CRM of customer accounts, project tasks and six weeks of daily product
metrics. Only the word lists below are hand-written; every row is drawn from them with
``random.Random(seed)``, so a task can carry just its world seed and the verifier rebuilds exactly
the same data. ``build_db(seed)`` loads a world into a fresh in-memory SQLite database.

The five "databases" of the recipe (email, calendar, CRM, project, analytics) are table groups of
one SQLite connection: they never need joins across each other, and one connection keeps a fresh
copy cheap (a few milliseconds), which matters because every ``verify`` builds two of them.

Properties the task templates rely on (kept true by construction, checked in tests):
* ``today`` is a Monday, so "last week" is exactly today-7 .. today-1;
* email timestamps are unique (so "the latest email from X" is well defined);
* customer revenues are unique (so "the highest-revenue customer" is well defined);
* ids of seed rows are below ``NEW_ID_BASE``; rows created by tools get ids from there up.
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
    "Ava", "Ben", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Isabel", "Jamal", "Keiko",
    "Liam", "Maya", "Noah", "Olga", "Priya", "Quentin", "Rosa", "Samir", "Tara", "Umar", "Vera",
    "Wei", "Ximena", "Yusuf", "Zoe", "Aaron", "Bianca", "Carlos", "Dana",
]
LAST_NAMES = [
    "Adams", "Brooks", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Hughes", "Ito", "Jensen",
    "Khan", "Lopez", "Moreau", "Novak", "Okafor", "Patel", "Quinn", "Rossi", "Silva", "Tanaka",
    "Ueda", "Varga", "Weber", "Xu", "Yilmaz", "Zimmer", "Baker", "Cohen", "Dubois", "Ferrari",
]
TEAMS = ["Sales", "Engineering", "Marketing", "Support", "Finance"]
ROLES = {"Sales": "Account Executive", "Engineering": "Software Engineer", "Marketing": "Marketing Manager",
         "Support": "Support Specialist", "Finance": "Financial Analyst"}
PROJECTS = ["Apollo", "Borealis", "Cascade", "Delta", "Everest"]
REGIONS = ["North", "South", "East", "West"]
CUSTOMER_STATUSES = ["lead", "active", "churned"]
TASK_STATUSES = ["todo", "in_progress", "done"]
PRIORITIES = ["low", "medium", "high"]
LOCATIONS = ["Room A", "Room B", "Room C", "Zoom"]
DURATIONS = [30, 45, 60]
TOPICS = [
    "Q3 budget", "hiring plan", "product roadmap", "launch checklist", "security review",
    "customer feedback", "pricing update", "offsite logistics", "quarterly report", "onboarding guide",
    "data migration", "vendor contract", "design system", "support backlog", "marketing campaign",
]
SUBJECT_FORMS = ["{topic} update", "Question about the {topic}", "Notes on the {topic}", "{topic}: next steps",
                 "Draft {topic}"]
BODY_FORMS = [
    "Hi {first}, here is the latest on the {topic}. Let me know what you think.",
    "Hi {first}, could you take a look at the {topic} before Friday?",
    "Hello {first}, I have attached my notes on the {topic}.",
    "Hi {first}, quick reminder that the {topic} is due soon.",
]
EVENT_FORMS = ["{topic} sync", "{topic} review", "{topic} planning", "{topic} kickoff"]
TASK_VERBS = ["Draft", "Review", "Update", "Test", "Document", "Prepare", "Fix", "Plan"]
TASK_OBJECTS = [
    "release notes", "API docs", "onboarding flow", "billing page", "login bug", "dashboard", "test plan",
    "budget sheet", "launch email", "search index", "mobile layout", "data export", "alert rules",
]
COMPANY_ADJ = ["Blue", "Bright", "Silver", "Green", "Rapid", "North", "Golden", "Clear", "Swift", "Prime",
               "Red", "Quiet"]
COMPANY_NOUN = ["River", "Peak", "Harbor", "Pine", "Falcon", "Stone", "Orbit", "Maple", "Beacon", "Cedar",
                "Summit", "Lantern"]
COMPANY_SUFFIX = ["Labs", "Systems", "Group", "Logistics", "Foods", "Health", "Media", "Energy"]
METRICS = {  # name → (daily low, daily high, how a person says it)
    "page_views": (2000, 6000, "page views"),
    "signups": (20, 120, "sign-ups"),
    "revenue": (5000, 20000, "revenue"),
    "support_tickets": (5, 40, "support tickets"),
    "active_users": (300, 900, "active users"),
}
FIRST_MONDAY = dt.date(2024, 1, 8)
N_EMPLOYEES, N_EMAILS, N_EVENTS, N_CUSTOMERS, N_TASKS = 20, 60, 40, 30, 60
METRIC_DAYS = 42
WORKDAY_SLOTS = [f"{h:02d}:{m:02d}" for h in range(9, 17) for m in (0, 30)]

SCHEMA = """
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, email TEXT UNIQUE, team TEXT, role TEXT);
CREATE TABLE emails (id INTEGER PRIMARY KEY, sender TEXT, recipient TEXT, subject TEXT, body TEXT,
                     sent_at TEXT);
CREATE TABLE events (id INTEGER PRIMARY KEY, title TEXT, start TEXT, duration_minutes INTEGER,
                     attendees TEXT, location TEXT);
CREATE TABLE customers (id INTEGER PRIMARY KEY, company TEXT, contact_name TEXT, contact_email TEXT,
                        region TEXT, status TEXT, revenue INTEGER, assigned_to TEXT, last_contact TEXT,
                        notes TEXT);
CREATE TABLE tasks (id INTEGER PRIMARY KEY, project TEXT, title TEXT, assignee TEXT, status TEXT,
                    due_date TEXT, priority TEXT);
CREATE TABLE metrics (metric TEXT, date TEXT, value INTEGER, PRIMARY KEY (metric, date));
"""

# What "the database state" means for grading: the tables tools can change, minus nothing.
# Directory and metrics are read-only, so they cannot differ and are left out.
STATE_SPECS = (
    TableSpec("emails", "id", ("sender", "recipient", "subject", "body", "sent_at"), ("subject", "body")),
    TableSpec("events", "id", ("title", "start", "duration_minutes", "attendees", "location"), ("title", "location")),
    TableSpec("customers", "id", ("company", "contact_name", "contact_email", "region", "status", "revenue",
                                  "assigned_to", "last_contact", "notes"), ("company", "contact_name", "notes")),
    TableSpec("tasks", "id", ("project", "title", "assignee", "status", "due_date", "priority"), ("title",)),
)


@dataclass(frozen=True)
class World:
    seed: int
    today: dt.date
    user: Row
    employees: list[Row]
    emails: list[Row]
    events: list[Row]
    customers: list[Row]
    tasks: list[Row]
    metrics: list[Row]

    @property
    def now(self) -> str:
        return f"{self.today.isoformat()} 09:00"

    def employee(self, email: str) -> Row:
        return next(e for e in self.employees if e["email"] == email)

    def name_of(self, email: str) -> str:
        for e in self.employees:
            if e["email"] == email:
                return e["name"]
        for c in self.customers:
            if c["contact_email"] == email:
                return c["contact_name"]
        return email


def _slug(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def _employees(rng: random.Random) -> list[Row]:
    names = rng.sample([(f, l) for f in FIRST_NAMES for l in LAST_NAMES], N_EMPLOYEES)
    out = []
    for i, (first, last) in enumerate(names):
        team = TEAMS[i % len(TEAMS)]  # round robin: every team, Sales included, has four people
        out.append({"id": i + 1, "name": f"{first} {last}", "email": f"{first}.{last}@acme.com".lower(),
                    "team": team, "role": ROLES[team]})
    return out


def _customers(rng: random.Random, employees: list[Row], today: dt.date) -> list[Row]:
    companies = rng.sample([f"{a} {n} {s}" for a in COMPANY_ADJ for n in COMPANY_NOUN for s in COMPANY_SUFFIX],
                           N_CUSTOMERS)
    revenues = rng.sample(range(20, 900), N_CUSTOMERS)  # unique, so "highest revenue" has one answer
    sales = [e["email"] for e in employees if e["team"] == "Sales"]
    out = []
    for i, company in enumerate(companies):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        out.append({
            "id": i + 1, "company": company, "contact_name": f"{first} {last}",
            "contact_email": f"{first.lower()}@{_slug(company)}.com", "region": rng.choice(REGIONS),
            "status": rng.choices(CUSTOMER_STATUSES, weights=[3, 5, 2])[0], "revenue": revenues[i] * 1000,
            "assigned_to": rng.choice(sales),
            "last_contact": (today - dt.timedelta(days=rng.randint(1, 120))).isoformat(), "notes": "",
        })
    return out


def _emails(rng: random.Random, user: Row, others: list[Row], customers: list[Row], today: dt.date) -> list[Row]:
    minutes = rng.sample(range(30 * 24 * 60), N_EMAILS)  # unique timestamps within the last 30 days
    start = dt.datetime.combine(today, dt.time(9, 0)) - dt.timedelta(days=30)
    out = []
    for i, minute in enumerate(sorted(minutes)):
        topic = rng.choice(TOPICS)
        if rng.random() < 0.75:  # mostly received mail; some from customers
            if rng.random() < 0.2:
                c = rng.choice(customers)
                sender, first_to = c["contact_email"], user["name"].split()[0]
            else:
                sender, first_to = rng.choice(others)["email"], user["name"].split()[0]
            recipient = user["email"]
        else:
            peer = rng.choice(others)
            sender, recipient, first_to = user["email"], peer["email"], peer["name"].split()[0]
        subject = rng.choice(SUBJECT_FORMS).format(topic=topic)
        out.append({
            "id": i + 1, "sender": sender, "recipient": recipient, "subject": subject[0].upper() + subject[1:],
            "body": rng.choice(BODY_FORMS).format(first=first_to, topic=topic),
            "sent_at": (start + dt.timedelta(minutes=minute)).strftime("%Y-%m-%d %H:%M"),
        })
    return out


def weekdays(start: dt.date, end: dt.date) -> list[dt.date]:
    """Monday–Friday dates from ``start`` to ``end`` inclusive."""
    days = (start + dt.timedelta(days=k) for k in range((end - start).days + 1))
    return [d for d in days if d.weekday() < 5]


def _events(rng: random.Random, others: list[Row], today: dt.date) -> list[Row]:
    days = weekdays(today - dt.timedelta(days=7), today + dt.timedelta(days=13))
    out = []
    for i in range(N_EVENTS):
        attendees = rng.sample(others, rng.choice([1, 1, 2, 3]))
        topic = rng.choice(TOPICS)
        title = rng.choice(EVENT_FORMS).format(topic=topic)
        out.append({
            "id": i + 1, "title": title[0].upper() + title[1:],
            "start": f"{rng.choice(days).isoformat()} {rng.choice(WORKDAY_SLOTS)}",
            "duration_minutes": rng.choice(DURATIONS),
            "attendees": ",".join(sorted(a["email"] for a in attendees)), "location": rng.choice(LOCATIONS),
        })
    return sorted(out, key=lambda e: (e["start"], e["id"]))


def _tasks(rng: random.Random, employees: list[Row], today: dt.date) -> list[Row]:
    titles = [f"{v} {o}" for v in TASK_VERBS for o in TASK_OBJECTS]
    out = []
    for i in range(N_TASKS):
        out.append({
            "id": i + 1, "project": rng.choice(PROJECTS), "title": rng.choice(titles),
            "assignee": rng.choice(employees[:10])["email"],  # half the company works on projects
            "status": rng.choices(TASK_STATUSES, weights=[4, 3, 3])[0],
            "due_date": (today + dt.timedelta(days=rng.randint(-14, 28))).isoformat(),
            "priority": rng.choice(PRIORITIES),
        })
    return out


def _metrics(rng: random.Random, today: dt.date) -> list[Row]:
    out = []
    for name, (lo, hi, _) in METRICS.items():
        for k in range(METRIC_DAYS, 0, -1):
            out.append({"metric": name, "date": (today - dt.timedelta(days=k)).isoformat(),
                        "value": rng.randint(lo, hi)})
    return out


@lru_cache(maxsize=128)
def generate_world(seed: int) -> World:
    """The company of world ``seed`` (cached; treat the result as read-only)."""
    rng = random.Random(f"workplace-world:{seed}")
    today = FIRST_MONDAY + dt.timedelta(weeks=rng.randrange(48))
    employees = _employees(rng)
    user, others = employees[0], employees[1:]
    customers = _customers(rng, employees, today)
    return World(
        seed=seed, today=today, user=user, employees=employees,
        emails=_emails(rng, user, others, customers, today), events=_events(rng, others, today),
        customers=customers, tasks=_tasks(rng, employees, today), metrics=_metrics(rng, today),
    )


def _insert(conn: sqlite3.Connection, table: str, rows: list[Row]) -> None:
    cols = list(rows[0])
    conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     [tuple(r[c] for c in cols) for r in rows])


class WorkplaceDB:
    """A live database plus the world facts tools need (who "me" is, what "now" is)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.conn = sqlite3.connect(":memory:")
        self.conn.row_factory = sqlite3.Row
        self.conn.executescript(SCHEMA)
        for table in ("employees", "emails", "events", "customers", "tasks", "metrics"):
            _insert(self.conn, table, getattr(world, table))
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def build_db(seed: int) -> WorkplaceDB:
    return WorkplaceDB(generate_world(seed))
