"""Task templates of the workplace environment: a request in words plus the calls that fulfil it.

A template reads a generated world (``data.py``) and draws one concrete request with its own
``random.Random``: it picks entities for which the request has exactly one right outcome (the one
meeting with X on that day, the highest-revenue customer of a region), phrases the request as a
person would (names, not ids or emails; "Friday, March 22" or an ISO date) and lists the
*reference calls*, the state-changing tool calls a correct assistant must make. Look-ups the
assistant needs along the way (directory_search, email_search, ...) change nothing and are not
listed. Question templates also set ``answer``: the value the final reply must state.

``build_task`` runs the reference calls on a fresh database (they must all succeed, and a
non-question task must change the state) and stores the resulting state's hash with them, so a
task is self-contained JSON: world seed + reference calls + hash. ``verify`` recomputes the
expected state from the same calls and refuses a task whose hash no longer matches (a task built
by an older version of the generator).
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from posttrain.envs.tools import reference_state, state_hash
from posttrain.envs.workplace.data import (
    DURATIONS, LOCATIONS, METRICS, PRIORITIES, PROJECTS, REGIONS, TASK_OBJECTS, TASK_VERBS, TOPICS,
    WORKDAY_SLOTS, COMPANY_ADJ, COMPANY_NOUN, COMPANY_SUFFIX, FIRST_NAMES, LAST_NAMES, STATE_SPECS, World,
    build_db, generate_world, weekdays,
)
from posttrain.envs.workplace.tools import TOOLBOX


@dataclass
class Draft:
    prompt: str
    calls: list[dict[str, Any]]
    answer: str | None = None


Template = Callable[[World, random.Random], "Draft | None"]
TEMPLATES: dict[str, Template] = {}


def template(fn: Template) -> Template:
    TEMPLATES[fn.__name__] = fn
    return fn


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"name": tool, "arguments": arguments}


def say_date(d: dt.date, rng: random.Random) -> str:
    """A date as a person writes it; sometimes ISO, mostly 'Friday, March 22'."""
    return d.isoformat() if rng.random() < 0.3 else f"{d:%A}, {d:%B} {d.day}"


def _day(s: str) -> dt.date:
    return dt.date.fromisoformat(s[:10])


def _attendees(event: dict[str, Any]) -> list[str]:
    return event["attendees"].split(",") if event["attendees"] else []


def _future_days(w: World, last: int = 13) -> list[dt.date]:
    return weekdays(w.today + dt.timedelta(days=1), w.today + dt.timedelta(days=last))


def _who(w: World, email: str) -> str:
    """How the user names someone: a colleague by name, a customer contact with their company."""
    for c in w.customers:
        if c["contact_email"] == email:
            return f"{c['contact_name']} from {c['company']}"
    return w.name_of(email)


def _open_tasks(w: World, project: str, assignee: str) -> list[dict[str, Any]]:
    return [t for t in w.tasks if t["project"] == project and t["assignee"] == assignee and t["status"] != "done"]


def _owner_phrase(w: World, email: str) -> str:
    return "my" if email == w.user["email"] else f"{_who(w, email)}'s"


# --------------------------------------------------------------------------- calendar


@template
def calendar_reschedule(w: World, rng: random.Random) -> Draft | None:
    future = [e for e in w.events if _day(e["start"]) > w.today]
    pairs = [
        (e, a) for e in future for a in _attendees(e)
        if sum(1 for x in w.events if x["start"][:10] == e["start"][:10] and a in _attendees(x)) == 1
    ]
    if not pairs:
        return None
    event, person = rng.choice(pairs)
    new_day = rng.choice([d for d in _future_days(w) if d != _day(event["start"])])
    time = rng.choice(WORKDAY_SLOTS)
    return Draft(
        f"Please move my meeting with {_who(w, person)} on {say_date(_day(event['start']), rng)} "
        f"to {say_date(new_day, rng)} at {time}. Keep everything else the same.",
        [call("calendar_update_event", event_id=event["id"], start=f"{new_day.isoformat()} {time}")],
    )


@template
def calendar_cancel(w: World, rng: random.Random) -> Draft | None:
    future = [e for e in w.events if _day(e["start"]) > w.today]
    unique = [e for e in future
              if sum(1 for x in w.events if x["title"] == e["title"] and x["start"][:10] == e["start"][:10]) == 1]
    if not unique:
        return None
    e = rng.choice(unique)
    return Draft(f"Cancel the '{e['title']}' meeting on {say_date(_day(e['start']), rng)}.",
                 [call("calendar_delete_event", event_id=e["id"])])


@template
def calendar_create(w: World, rng: random.Random) -> Draft | None:
    people = rng.sample(w.employees[1:], rng.choice([1, 2]))
    title = f"{rng.choice(TOPICS)} {rng.choice(['workshop', 'check-in', 'deep dive'])}"
    title = title[0].upper() + title[1:]
    day, time = rng.choice(_future_days(w)), rng.choice(WORKDAY_SLOTS)
    duration, location = rng.choice(DURATIONS), rng.choice(LOCATIONS)
    names = " and ".join(p["name"] for p in people)
    return Draft(
        f"Schedule a {duration}-minute meeting called '{title}' with {names} on {say_date(day, rng)} at {time} "
        f"in {location}.",
        [call("calendar_create_event", title=title, start=f"{day.isoformat()} {time}", duration_minutes=duration,
              attendees=sorted(p["email"] for p in people), location=location)],
    )


@template
def calendar_cancel_next_week(w: World, rng: random.Random) -> Draft | None:
    start, end = w.today + dt.timedelta(days=7), w.today + dt.timedelta(days=11)
    next_week = [e for e in w.events if start <= _day(e["start"]) <= end]
    people = sorted({a for e in next_week for a in _attendees(e)})
    if not people:
        return None
    person = rng.choice(people)
    doomed = [e for e in next_week if person in _attendees(e)]
    return Draft(f"{_who(w, person)} is on holiday next week. Cancel all my meetings with them next week.",
                 [call("calendar_delete_event", event_id=e["id"]) for e in doomed])


# --------------------------------------------------------------------------- email

REPLIES = ["Thanks, I will take a look today.", "Sounds good, let's discuss it on Thursday.",
           "Got it, I will send my comments by Friday.", "Thank you! This looks good to me."]


@template
def email_send(w: World, rng: random.Random) -> Draft | None:
    person = rng.choice(w.employees[1:])
    topic = rng.choice(TOPICS)
    subject = f"{topic[0].upper()}{topic[1:]} follow-up"
    body = f"Hi {person['name'].split()[0]}, can we meet this week to go over the {topic}?"
    return Draft(f"Send an email to {person['name']} with the subject '{subject}' and the body '{body}'",
                 [call("email_send", recipient=person["email"], subject=subject, body=body)])


@template
def email_reply_latest(w: World, rng: random.Random) -> Draft | None:
    me = w.user["email"]
    colleagues = {e["email"] for e in w.employees}
    senders = sorted({m["sender"] for m in w.emails if m["recipient"] == me and m["sender"] in colleagues})
    if not senders:
        return None
    sender = rng.choice(senders)
    latest = max((m for m in w.emails if m["sender"] == sender and m["recipient"] == me), key=lambda m: m["sent_at"])
    body = rng.choice(REPLIES)
    return Draft(f"Reply to the most recent email {_who(w, sender)} sent me with: '{body}'",
                 [call("email_reply", email_id=latest["id"], body=body)])


@template
def email_forward(w: World, rng: random.Random) -> Draft | None:
    me = w.user["email"]
    received = [m for m in w.emails if m["recipient"] == me]
    unique = [m for m in received if sum(1 for x in w.emails if x["subject"] == m["subject"]) == 1]
    if not unique:
        return None
    m = rng.choice(unique)
    to = rng.choice([e for e in w.employees[1:] if e["email"] != m["sender"]])
    return Draft(f"Forward the email '{m['subject']}' from {_who(w, m['sender'])} to {to['name']}.",
                 [call("email_forward", email_id=m["id"], recipient=to["email"])])


@template
def email_delete_before(w: World, rng: random.Random) -> Draft | None:
    me = w.user["email"]
    received = [m for m in w.emails if m["recipient"] == me]
    if not received:
        return None
    anchor = rng.choice(received)
    cutoff = _day(anchor["sent_at"]) + dt.timedelta(days=1)
    doomed = [m for m in received if m["sender"] == anchor["sender"] and _day(m["sent_at"]) < cutoff]
    return Draft(f"Delete all emails that {_who(w, anchor['sender'])} sent me before {say_date(cutoff, rng)}.",
                 [call("email_delete", email_id=m["id"]) for m in doomed])


# --------------------------------------------------------------------------- CRM

OUTREACH = [("Renewal discussion", "Hello, I would like to schedule a call about your contract renewal."),
            ("Quarterly check-in", "Hello, do you have time for our quarterly check-in next week?"),
            ("New product preview", "Hello, we would love to show you a preview of our new product.")]
NOTES = ["Asked for a discount on the annual plan.", "Prefers to be contacted by email.",
         "Budget approved for next quarter.", "Waiting on their legal review."]


@template
def crm_email_top_customer(w: World, rng: random.Random) -> Draft | None:
    regions = [r for r in REGIONS if any(c["region"] == r and c["status"] == "active" for c in w.customers)]
    if not regions:
        return None
    region = rng.choice(regions)
    top = max((c for c in w.customers if c["region"] == region and c["status"] == "active"),
              key=lambda c: c["revenue"])
    subject, body = rng.choice(OUTREACH)
    body = f"{body} Best regards, {w.user['name'].split()[0]}"
    return Draft(f"Email the contact person of our active customer with the highest revenue in the {region} "
                 f"region. Use the subject '{subject}' and the body '{body}'",
                 [call("email_send", recipient=top["contact_email"], subject=subject, body=body)])


@template
def crm_update_status(w: World, rng: random.Random) -> Draft | None:
    c = rng.choice(w.customers)
    target = rng.choice([s for s in ("lead", "active", "churned") if s != c["status"]])
    if rng.random() < 0.5:
        return Draft(f"Change the status of {c['company']} to {target} in the CRM.",
                     [call("crm_update_customer", customer_id=c["id"], status=target)])
    note = rng.choice(NOTES)
    return Draft(f"In the CRM, set {c['company']} to {target} and replace its notes with '{note}'",
                 [call("crm_update_customer", customer_id=c["id"], status=target, notes=note)])


@template
def crm_reassign_region(w: World, rng: random.Random) -> Draft | None:
    pairs = sorted({(c["assigned_to"], c["region"]) for c in w.customers})
    owner, region = rng.choice(pairs)
    sales = [e for e in w.employees if e["team"] == "Sales" and e["email"] != owner]
    new_owner = rng.choice(sales)
    moved = [c for c in w.customers if c["assigned_to"] == owner and c["region"] == region]
    return Draft(f"{_who(w, owner)} is moving to another territory: reassign all of their customers in the "
                 f"{region} region to {new_owner['name']}.",
                 [call("crm_update_customer", customer_id=c["id"], assigned_to=new_owner["email"]) for c in moved])


@template
def crm_add_lead(w: World, rng: random.Random) -> Draft | None:
    taken = {c["company"] for c in w.customers}
    company = rng.choice([n for n in (f"{a} {b} {s}" for a in COMPANY_ADJ for b in COMPANY_NOUN
                                      for s in COMPANY_SUFFIX) if n not in taken])
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    email = f"{first}.{last}@{''.join(ch for ch in company.lower() if ch.isalnum())}.com".lower()
    region = rng.choice(REGIONS)
    owner = rng.choice([w.user] + [e for e in w.employees if e["team"] == "Sales"])
    owner_text = "me" if owner is w.user else owner["name"]
    return Draft(f"Add {company} to the CRM as a new lead in the {region} region. The contact is {first} {last} "
                 f"({email}); assign the account to {owner_text}.",
                 [call("crm_add_customer", company=company, contact_name=f"{first} {last}", contact_email=email,
                       region=region, status="lead", assigned_to=owner["email"])])


# --------------------------------------------------------------------------- projects


def _project_owner_pairs(w: World) -> list[tuple[str, str]]:
    return sorted({(t["project"], t["assignee"]) for t in w.tasks if t["status"] != "done"})


@template
def project_complete_tasks(w: World, rng: random.Random) -> Draft | None:
    project, person = rng.choice(_project_owner_pairs(w))
    return Draft(f"Mark all of {_owner_phrase(w, person)} unfinished tasks in project {project} as done.",
                 [call("project_update_task", task_id=t["id"], status="done")
                  for t in _open_tasks(w, project, person)])


@template
def project_reassign(w: World, rng: random.Random) -> Draft | None:
    project, person = rng.choice(_project_owner_pairs(w))
    new = rng.choice([e for e in w.employees[:10] if e["email"] != person])
    new_text = "me" if new is w.user else new["name"]
    return Draft(f"Reassign all of {_owner_phrase(w, person)} unfinished tasks in project {project} to {new_text}.",
                 [call("project_update_task", task_id=t["id"], assignee=new["email"])
                  for t in _open_tasks(w, project, person)])


@template
def project_create_task(w: World, rng: random.Random) -> Draft | None:
    person = rng.choice(w.employees[:10])
    title = f"{rng.choice(TASK_VERBS)} {rng.choice(TASK_OBJECTS)}"
    project, priority = rng.choice(PROJECTS), rng.choice(PRIORITIES)
    due = w.today + dt.timedelta(days=rng.randint(3, 30))
    who = "me" if person is w.user else person["name"]
    return Draft(f"Create a {priority}-priority task '{title}' in project {project} for {who}, due "
                 f"{say_date(due, rng)}.",
                 [call("project_create_task", project=project, title=title, assignee=person["email"],
                       due_date=due.isoformat(), priority=priority)])


@template
def project_push_overdue(w: World, rng: random.Random) -> Draft | None:
    today = w.today.isoformat()
    overdue = [t for t in w.tasks if t["status"] != "done" and t["due_date"] < today]
    projects = sorted({t["project"] for t in overdue})
    if not projects:
        return None
    project = rng.choice(projects)
    new_due = w.today + dt.timedelta(days=rng.randint(3, 14))
    return Draft(f"Push the due date of every overdue, unfinished task in project {project} to "
                 f"{say_date(new_due, rng)}.",
                 [call("project_update_task", task_id=t["id"], due_date=new_due.isoformat())
                  for t in overdue if t["project"] == project])


# --------------------------------------------------------------------------- analytics


def _metric_values(w: World, metric: str, start: dt.date, end: dt.date) -> list[int]:
    return [m["value"] for m in w.metrics
            if m["metric"] == metric and start.isoformat() <= m["date"] <= end.isoformat()]


def _random_period(w: World, rng: random.Random) -> tuple[dt.date, dt.date]:
    length = rng.randint(3, 10)
    end = w.today - dt.timedelta(days=rng.randint(1, 28))
    return end - dt.timedelta(days=length - 1), end


@template
def analytics_email_total(w: World, rng: random.Random) -> Draft | None:
    metric = rng.choice(list(METRICS))
    label = METRICS[metric][2]
    start, end = _random_period(w, rng)
    total = sum(_metric_values(w, metric, start, end))
    person = rng.choice(w.employees[1:])
    subject = f"{label[0].upper()}{label[1:]} report"
    body_form = f"Total {label} from {start.isoformat()} to {end.isoformat()}: N"
    return Draft(f"Email {person['name']} the total {label} from {start.isoformat()} to {end.isoformat()}. Use the "
                 f"subject '{subject}' and the body '{body_form}', with N replaced by the number.",
                 [call("email_send", recipient=person["email"], subject=subject, body=body_form[:-1] + str(total))])


@template
def analytics_conditional(w: World, rng: random.Random) -> Draft | None:
    metric = rng.choice(list(METRICS))
    label = METRICS[metric][2]
    last = sum(_metric_values(w, metric, w.today - dt.timedelta(days=7), w.today - dt.timedelta(days=1)))
    before = sum(_metric_values(w, metric, w.today - dt.timedelta(days=14), w.today - dt.timedelta(days=8)))
    project, person = rng.choice(PROJECTS), rng.choice(w.employees[1:])
    due = w.today + dt.timedelta(days=4)
    title = f"Review {label} growth"
    subject, body = f"{label[0].upper()}{label[1:]} dropped", f"Our {label} did not grow last week. Can we discuss?"
    if last > before:
        calls = [call("project_create_task", project=project, title=title, assignee=w.user["email"],
                      due_date=due.isoformat(), priority="high")]
    else:
        calls = [call("email_send", recipient=person["email"], subject=subject, body=body)]
    return Draft(f"Compare our total {label} last week (Monday to Sunday) with the week before. If last week was "
                 f"higher, create a high-priority task '{title}' in project {project}, assigned to me and due "
                 f"{say_date(due, rng)}. Otherwise, email {person['name']} with the subject '{subject}' and the "
                 f"body '{body}'", calls)


# --------------------------------------------------------------------------- questions (read-only)

ANSWER_FORMAT = "Finish your reply with a line 'Answer: {what}'."


@template
def question_open_tasks(w: World, rng: random.Random) -> Draft | None:
    project, person = rng.choice(sorted({(t["project"], t["assignee"]) for t in w.tasks}))
    n = len(_open_tasks(w, project, person))
    subject = "do I" if person == w.user["email"] else f"does {_who(w, person)}"
    return Draft(f"How many unfinished tasks {subject} have in project {project}? "
                 + ANSWER_FORMAT.format(what="<number>"), [], answer=str(n))


@template
def question_metric(w: World, rng: random.Random) -> Draft | None:
    metric = rng.choice(list(METRICS))
    label = METRICS[metric][2]
    start, end = _random_period(w, rng)
    values = _metric_values(w, metric, start, end)
    wording, value = rng.choice([("total", sum(values)), ("highest single-day", max(values)),
                                 ("lowest single-day", min(values))])
    return Draft(f"What was the {wording} {label} between {say_date(start, rng)} and {say_date(end, rng)} "
                 f"(both days included)? " + ANSWER_FORMAT.format(what="<number>"), [], answer=str(value))


@template
def question_top_customer(w: World, rng: random.Random) -> Draft | None:
    region = rng.choice(REGIONS)
    in_region = [c for c in w.customers if c["region"] == region]
    if not in_region:
        return None
    top = max(in_region, key=lambda c: c["revenue"])
    return Draft(f"Which customer in the {region} region has the highest revenue in the CRM? "
                 + ANSWER_FORMAT.format(what="<company name>"), [], answer=top["company"])


# --------------------------------------------------------------------------- task assembly


def expected_state(world_seed: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The state after running ``calls`` on a fresh database; raises if a call fails (a generator bug)."""
    return reference_state(TOOLBOX, build_db(world_seed), calls, STATE_SPECS)


@lru_cache(maxsize=64)
def initial_state(world_seed: int) -> dict[str, Any]:
    """The untouched state of a world (cached; read-only)."""
    return expected_state(world_seed, [])


def draft_task(template_name: str, world_seed: int, rng_key: str) -> tuple[World, Draft] | None:
    world = generate_world(world_seed)
    draft = TEMPLATES[template_name](world, random.Random(rng_key))
    return None if draft is None else (world, draft)


def ground_truth(world_seed: int, draft: Draft) -> dict[str, Any]:
    state = expected_state(world_seed, draft.calls)
    if draft.answer is None and state == initial_state(world_seed):
        raise ValueError(f"task in world {world_seed} changes nothing: {draft.prompt}")
    return {"reference_calls": draft.calls, "state_hash": state_hash(state), "answer": draft.answer}
