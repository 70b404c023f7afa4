"""Structured-output environment (docs/recipe.md §2.4): reply with JSON that conforms to a schema.

Each task is a short generated document (an invoice, a person profile, a product listing, an event
announcement, a job posting) and a JSON Schema for its details. The reward is exact adherence: 1 if
the reply parses as JSON and validates against the schema (``jsonschema.Draft202012Validator``),
else 0. There is no partial credit and no reward for content (docs/recipe.md §2.4): a valid object with wrong
values still scores 1. A reference extraction is kept in the ground truth for SFT data and tests;
it is never graded.

What the reply may look like (``extract.extract_json``): bare JSON, or JSON inside one fenced block
(```json or ```), with any text around the fence ignored. Two or more fenced blocks score 0
("multiple_json_blocks"). The reason for a 0 is the parse error, or the most relevant validation
error (``jsonschema.exceptions.best_match``) with its JSON path.

Schemas vary per task so a model cannot learn one shape: each optional field is asked for or not,
required or not; fields the document does not state are sometimes asked for but never required;
``additionalProperties: false`` is set on about half the objects; keys are snake_case or camelCase.
They use the keywords a model has to respect: types (integer vs number vs string), ``enum``,
``pattern`` (dates, codes), ``minimum``/``maximum``, nested objects and arrays with ``minItems``.
``format`` is avoided: validators do not enforce it by default, so it would promise a check that
never happens. Every reference is validated against its schema in the tests.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from posttrain.envs.base import (
    ENVIRONMENTS,
    Environment,
    Message,
    Split,
    Task,
    VerifyResult,
    final_answer_text,
)
from posttrain.envs.extract import content_id, extract_json, take_split

DEFAULT_N = {"train": 2000, "dev": 200, "test": 200}
P_ASK_PRESENT = 0.8  # an optional field the document states is in the schema
P_REQUIRE = 0.6  # ... and, if asked for, required
P_ASK_ABSENT = 0.4  # a field the document does not state is still offered (never required)
P_CLOSED = 0.5  # an object gets additionalProperties: false

# Small vocabularies; all combinations are generated.
FIRST = ["Maria", "James", "Aisha", "Kenji", "Lucia", "Omar", "Sofia", "Liam", "Priya", "Noah", "Elena", "Tomas"]
LAST = ["Lopez", "Smith", "Khan", "Tanaka", "Rossi", "Haddad", "Novak", "Murphy", "Patel", "Berg", "Silva", "Weber"]
CITIES = [("Leeds", "United Kingdom"), ("Lyon", "France"), ("Porto", "Portugal"), ("Graz", "Austria"),
          ("Utrecht", "Netherlands"), ("Bologna", "Italy"), ("Austin", "United States"), ("Osaka", "Japan")]
STREETS = ["Harbour Street", "Mill Lane", "Station Road", "Elm Avenue", "Church Street", "Park Road"]
COMPANY_A = ["Acme", "Northwind", "Bluebird", "Granite", "Silverline", "Oakwood", "Brightpath", "Keystone"]
COMPANY_B = ["Tools", "Supplies", "Labs", "Systems", "Trading", "Logistics", "Studio", "Foods"]
CURRENCIES = {"EUR": "€", "USD": "$", "GBP": "£"}
ITEMS = ["steel hammer", "tape measure", "desk lamp", "notebook pack", "coffee grinder", "garden hose",
         "USB cable", "office chair", "paint roller", "water bottle", "wall clock", "toolbox"]
ADJ = ["Compact", "Deluxe", "Eco", "Classic", "Pro", "Ultra", "Smart", "Mini"]
CATEGORIES = {"kitchen": ["kettle", "blender", "toaster"], "garden": ["sprinkler", "pruner", "planter"],
              "electronics": ["speaker", "headphones", "charger"], "office": ["stapler", "monitor stand", "desk organiser"]}
OCCUPATIONS = ["nurse", "software engineer", "teacher", "electrician", "accountant", "chef", "architect"]
STATUSES = ["employed", "self-employed", "student", "retired"]
LANGUAGES = ["English", "Spanish", "French", "German", "Japanese", "Arabic", "Portuguese", "Italian"]
EVENT_KINDS = ["Jazz Night", "Book Fair", "Science Talk", "Food Market", "Film Screening", "Charity Run"]
SEASONS = ["Spring", "Summer", "Autumn", "Winter", "Midweek", "Open-Air"]
VENUES = ["Riverside Hall", "The Old Library", "Central Park Pavilion", "Civic Centre", "Harbour Arts Space"]
TICKETS = ["adult", "student", "child", "senior"]
JOB_TITLES = ["Data Analyst", "Backend Developer", "Site Manager", "Lab Technician", "UX Designer", "Accountant"]
SKILLS = ["SQL", "Python", "Excel", "project planning", "customer service", "Figma", "statistics", "Go", "safety audits"]
WORK_MODES = ["on-site", "hybrid", "remote"]

DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "date as YYYY-MM-DD"}
TIME = {"type": "string", "pattern": r"^\d{2}:\d{2}$", "description": "24-hour time as HH:MM"}
STR = {"type": "string"}
INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}


def enum(values: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


def array(items: dict[str, Any], min_items: int = 1) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": min_items}


# A field offered to the schema: (name, schema, value in the document or None if not stated).
FieldSpec = tuple[str, dict[str, Any], Any]


def pick_object(rng: random.Random, fields: list[FieldSpec], core: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Choose which fields an object schema asks for and requires → (schema, reference value).

    ``core`` fields are always asked for and required. A nested object is passed in as a field
    whose schema and value came from an earlier ``pick_object`` call.
    """
    props: dict[str, Any] = {}
    required: list[str] = []
    reference: dict[str, Any] = {}
    for name, schema, value in fields:
        stated = value is not None
        if name in core:
            ask, need = True, True
        elif stated:
            ask = rng.random() < P_ASK_PRESENT
            need = ask and rng.random() < P_REQUIRE
        else:
            ask, need = rng.random() < P_ASK_ABSENT, False
        if not ask:
            continue
        props[name] = schema
        if need:
            required.append(name)
        if stated:
            reference[name] = value
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    if rng.random() < P_CLOSED:
        out["additionalProperties"] = False
    return out, reference


def fixed_object(fields: dict[str, dict[str, Any]], closed: bool) -> dict[str, Any]:
    """An object schema with every field required (array items: one shape for all elements)."""
    out: dict[str, Any] = {"type": "object", "properties": fields, "required": list(fields)}
    if closed:
        out["additionalProperties"] = False
    return out


# --------------------------------------------------------------------------- key style


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def restyle_schema(schema: Any, key: Callable[[str], str]) -> Any:
    """Rename property names (``properties`` keys and ``required`` entries) all the way down."""
    if isinstance(schema, list):
        return [restyle_schema(s, key) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "properties":
            out[k] = {key(p): restyle_schema(s, key) for p, s in v.items()}
        elif k == "required":
            out[k] = [key(p) for p in v]
        else:
            out[k] = restyle_schema(v, key)
    return out


def restyle_value(value: Any, key: Callable[[str], str]) -> Any:
    if isinstance(value, dict):
        return {key(k): restyle_value(v, key) for k, v in value.items()}
    if isinstance(value, list):
        return [restyle_value(v, key) for v in value]
    return value


# --------------------------------------------------------------------------- documents


@dataclass(frozen=True)
class Document:
    kind: str
    text: str
    schema: dict[str, Any]
    reference: dict[str, Any]


def _date(rng: random.Random) -> dt.date:
    return dt.date(2023, 1, 1) + dt.timedelta(days=rng.randint(0, 3 * 365))


def _say_date(rng: random.Random, d: dt.date) -> str:
    """Dates are written the way people write them; the schema asks for ISO."""
    return rng.choice([d.isoformat(), f"{d.day} {d:%B %Y}", f"{d:%B} {d.day}, {d.year}"])


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _company(rng: random.Random) -> str:
    return f"{rng.choice(COMPANY_A)} {rng.choice(COMPANY_B)}"


def _money_style(rng: random.Random, code: str) -> Callable[[float], str]:
    """How one document writes amounts: "€12.50" or "12.50 EUR" (consistent within a document)."""
    if rng.random() < 0.5:
        return lambda amount: f"{CURRENCIES[code]}{amount:.2f}"
    return lambda amount: f"{amount:.2f} {code}"


def invoice(rng: random.Random) -> tuple[str, list[FieldSpec], set[str]]:
    number = f"INV-{rng.randint(2023, 2025)}-{rng.randint(1, 9999):04d}"
    issued = _date(rng)
    due = issued + dt.timedelta(days=rng.choice([14, 30, 45]))
    code = rng.choice(list(CURRENCIES))
    money = _money_style(rng, code)
    seller_name, (city, _) = _company(rng), rng.choice(CITIES)
    customer = _person(rng)
    items = [{"description": d, "quantity": rng.randint(1, 12), "unit_price": rng.randint(99, 9999) / 100}
             for d in rng.sample(ITEMS, rng.randint(1, 4))]
    total = round(sum(i["quantity"] * i["unit_price"] for i in items), 2)
    paid = rng.random() < 0.5
    notes = rng.choice([None, "Thank you for your business.", "Please quote the invoice number with payment."])
    lines = [f"INVOICE {number}", f"From: {seller_name}, {city}", f"Bill to: {customer}",
             f"Issued: {_say_date(rng, issued)}"]
    if not paid:
        lines.append(f"Payment due: {_say_date(rng, due)}")
    lines += [f"  {i['quantity']} x {i['description']} @ {money(i['unit_price'])}" for i in items]
    lines.append(f"Total: {money(total)}" + ("  (PAID)" if paid else ""))
    if notes:
        lines.append(notes)
    seller = pick_object(rng, [("name", STR, seller_name), ("city", STR, city)], core={"name"})
    item_schema = fixed_object({"description": STR, "quantity": {"type": "integer", "minimum": 1},
                                "unit_price": {"type": "number", "minimum": 0}}, rng.random() < P_CLOSED)
    fields: list[FieldSpec] = [
        ("invoice_number", {"type": "string", "pattern": r"^INV-\d{4}-\d{4}$"}, number),
        ("issue_date", DATE, issued.isoformat()),
        ("due_date", DATE, None if paid else due.isoformat()),
        ("seller", *seller),
        ("customer_name", STR, customer),
        ("currency", enum(list(CURRENCIES)), code),
        ("line_items", array(item_schema), items),
        ("total", {"type": "number", "minimum": 0}, total),
        ("paid", BOOL, paid),
        ("notes", STR, notes),
    ]
    return "\n".join(lines), fields, {"invoice_number"}


def person_profile(rng: random.Random) -> tuple[str, list[FieldSpec], set[str]]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    age = rng.randint(18, 80)
    status = "retired" if age >= 67 else rng.choice(STATUSES[:3])
    job = rng.choice(OCCUPATIONS)
    street, (city, country) = f"{rng.randint(1, 200)} {rng.choice(STREETS)}", rng.choice(CITIES)
    postcode = f"{rng.randint(1000, 99999)}"
    email = f"{first}.{last}@example.com".lower()
    langs = rng.sample(LANGUAGES, rng.randint(1, 3))
    since = rng.randint(2005, 2024)
    phone = rng.choice([None, f"+{rng.randint(1, 99)} {rng.randint(100, 999)} {rng.randint(100000, 999999)}"])
    work = {"employed": f"works as a {job}", "self-employed": f"is a self-employed {job}",
            "student": f"is a student training to be a {job}", "retired": f"is a retired {job}"}[status]
    text = (f"{first} {last} ({age}) {work}. {first} lives at {street}, {postcode} {city}, {country}, and "
            f"speaks {', '.join(langs)}. Contact: {email}" + (f", phone {phone}" if phone else "") +
            f". Member since {since}.")
    address = pick_object(rng, [("street", STR, street), ("city", STR, city), ("postcode", STR, postcode),
                                ("country", STR, country)], core={"city"})
    fields: list[FieldSpec] = [
        ("full_name", STR, f"{first} {last}"),
        ("age", {"type": "integer", "minimum": 0, "maximum": 130}, age),
        ("email", {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+\.[a-z]+$"}, email),
        ("occupation", STR, job),
        ("employment_status", enum(STATUSES), status),
        ("address", *address),
        ("languages", {**array(STR), "uniqueItems": True}, langs),
        ("member_since", {"type": "integer", "minimum": 1900}, since),
        ("phone", STR, phone),
    ]
    return text, fields, {"full_name"}


def product_listing(rng: random.Random) -> tuple[str, list[FieldSpec], set[str]]:
    category = rng.choice(sorted(CATEGORIES))
    name = f"{rng.choice(ADJ)} {rng.choice(CATEGORIES[category])}"
    sku = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(3)) + f"-{rng.randint(0, 9999):04d}"
    code, price = rng.choice(list(CURRENCIES)), rng.randint(499, 49999) / 100
    money = _money_style(rng, code)
    stock = rng.choice([0, rng.randint(1, 250)])
    dims = {"width": rng.randint(5, 80), "height": rng.randint(5, 80), "depth": rng.randint(2, 40)}
    tags = rng.sample(["new", "bestseller", "eco", "gift idea", "sale", "limited"], rng.randint(1, 3))
    rating = rng.choice([None, rng.randint(10, 50) / 10])
    lines = [f"{name} ({category})", f"SKU {sku}", f"Price: {money(price)}",
             f"Availability: {f'{stock} in stock' if stock else 'out of stock'}",
             f"Size: {dims['width']} x {dims['height']} x {dims['depth']} cm (W x H x D)",
             f"Tags: {', '.join(tags)}"]
    if rating is not None:
        lines.append(f"Customer rating: {rating}/5")
    price_obj = pick_object(rng, [("amount", {"type": "number", "minimum": 0}, price),
                                  ("currency", enum(list(CURRENCIES)), code)], core={"amount", "currency"})
    dims_obj = pick_object(rng, [(k, {"type": "number", "minimum": 0}, v) for k, v in dims.items()], core=set(dims))
    fields: list[FieldSpec] = [
        ("name", STR, name),
        ("sku", {"type": "string", "pattern": r"^[A-Z]{3}-\d{4}$"}, sku),
        ("category", enum(sorted(CATEGORIES)), category),
        ("price", *price_obj),
        ("in_stock", BOOL, stock > 0),
        ("stock_count", {"type": "integer", "minimum": 0}, stock),
        ("dimensions_cm", *dims_obj),
        ("tags", array(STR), tags),
        ("rating", {"type": "number", "minimum": 0, "maximum": 5}, rating),
    ]
    return "\n".join(lines), fields, {"name", "sku"}


def event_announcement(rng: random.Random) -> tuple[str, list[FieldSpec], set[str]]:
    title = f"{rng.choice(SEASONS)} {rng.choice(EVENT_KINDS)}"
    day = _date(rng)
    start = f"{rng.randint(9, 21):02d}:{rng.choice([0, 15, 30, 45]):02d}"
    venue, (city, _) = rng.choice(VENUES), rng.choice(CITIES)
    code = rng.choice(list(CURRENCIES))
    money = _money_style(rng, code)
    prices = [{"type": t, "price": float(rng.randint(0, 40))} for t in rng.sample(TICKETS, rng.randint(1, 3))]
    performers = [_person(rng) for _ in range(rng.randint(1, 3))]
    registration = rng.random() < 0.5
    capacity = rng.choice([None, rng.randint(2, 50) * 10])
    ticket_text = ", ".join(f"{p['type']} {money(p['price'])}" for p in prices)
    text = (f"Join us for the {title} on {_say_date(rng, day)} at {start}, {venue}, {city}. "
            f"With {', '.join(performers)}. Tickets: {ticket_text}. "
            + ("Registration is required. " if registration else "No registration needed. ")
            + (f"Limited to {capacity} places." if capacity else "")).strip()
    venue_obj = pick_object(rng, [("name", STR, venue), ("city", STR, city)], core={"name"})
    ticket_schema = fixed_object({"type": enum(TICKETS), "price": {"type": "number", "minimum": 0}},
                                 rng.random() < P_CLOSED)
    fields: list[FieldSpec] = [
        ("title", STR, title),
        ("date", DATE, day.isoformat()),
        ("start_time", TIME, start),
        ("venue", *venue_obj),
        ("ticket_prices", array(ticket_schema), prices),
        ("currency", enum(list(CURRENCIES)), code),
        ("performers", array(STR), performers),
        ("registration_required", BOOL, registration),
        ("capacity", {"type": "integer", "minimum": 1}, capacity),
    ]
    return text, fields, {"title"}


def job_posting(rng: random.Random) -> tuple[str, list[FieldSpec], set[str]]:
    title, company = rng.choice(JOB_TITLES), _company(rng)
    city, _ = rng.choice(CITIES)
    mode = rng.choice(WORK_MODES)
    code = rng.choice(list(CURRENCIES))
    low = rng.randint(25, 80) * 1000
    high = low + rng.randint(5, 30) * 1000
    skills = rng.sample(SKILLS, rng.randint(1, 4))
    years = rng.randint(0, 8)
    deadline = rng.choice([None, _date(rng)])
    text = (f"{company} is hiring a {title} in {city} ({mode}). Salary {CURRENCIES[code]}{low:,}–"
            f"{CURRENCIES[code]}{high:,} per year. You bring {years}+ years of experience and skills in "
            f"{', '.join(skills)}." + (f" Apply by {_say_date(rng, deadline)}." if deadline else ""))
    salary = pick_object(rng, [("min", INT, low), ("max", INT, high), ("currency", enum(list(CURRENCIES)), code)],
                         core={"min", "max"})
    fields: list[FieldSpec] = [
        ("title", STR, title),
        ("company", STR, company),
        ("location", STR, city),
        ("work_mode", enum(WORK_MODES), mode),
        ("salary", *salary),
        ("skills", array(STR), skills),
        ("experience_years", {"type": "integer", "minimum": 0}, years),
        ("apply_by", DATE, deadline.isoformat() if deadline else None),
    ]
    return text, fields, {"title", "company"}


DOCUMENT_KINDS: dict[str, Callable[[random.Random], tuple[str, list[FieldSpec], set[str]]]] = {
    "invoice": invoice,
    "person profile": person_profile,
    "product listing": product_listing,
    "event announcement": event_announcement,
    "job posting": job_posting,
}


def make_document(kind: str, rng: random.Random) -> Document:
    text, fields, core = DOCUMENT_KINDS[kind](rng)
    schema, reference = pick_object(rng, fields, core)
    if rng.random() < 0.5:
        schema, reference = restyle_schema(schema, camel), restyle_value(reference, camel)
    return Document(kind, text, schema, reference)


def count_fields(schema: dict[str, Any]) -> int:
    """Leaf properties in a schema (nested objects and array items included): a size measure."""
    if schema.get("type") == "array":
        return count_fields(schema["items"])
    props = schema.get("properties")
    if not props:
        return 1
    return sum(count_fields(s) for s in props.values())


def compact_json(value: Any, indent: str = "") -> str:
    """Pretty JSON that keeps short objects and lists on one line (shorter prompts, same JSON)."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(indent) + len(flat) <= 80 or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + "  "
    if isinstance(value, dict):
        body = [f"{inner}{json.dumps(k)}: {compact_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(body) + f"\n{indent}}}"
    body = [f"{inner}{compact_json(v, inner)}" for v in value]
    return "[\n" + ",\n".join(body) + f"\n{indent}]"


def render_prompt(doc: Document) -> str:
    schema = compact_json(doc.schema)
    return (
        f"Extract the details of this {doc.kind} as JSON.\n\n<document>\n{doc.text}\n</document>\n\n"
        f"Your JSON must conform to this JSON Schema (draft 2020-12):\n```json\n{schema}\n```\n\n"
        "Leave out fields the document does not give. Reply with the JSON object only; you may put "
        "it in a ```json code block."
    )


# --------------------------------------------------------------------------- grading


@functools.lru_cache(maxsize=4096)
def _validator(schema_json: str) -> Draft202012Validator:
    # Building a validator walks the schema; group samples share one task, so build it once.
    return Draft202012Validator(json.loads(schema_json))


def check_schema(value: Any, schema: dict[str, Any]) -> str | None:
    """None if ``value`` validates, else the most relevant error as "path: message"."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    try:
        error = best_match(validator.iter_errors(value))
    except RecursionError:
        return "$: value nested too deeply to validate"
    if error is None:
        return None
    message = re.sub(r"\s+", " ", error.message)
    return f"{error.json_path}: {message[:160]}"


@ENVIRONMENTS.register("structured")
class StructuredEnv(Environment):
    name = "structured"
    domain = "structured_output"

    def _candidates(self, seed: int) -> Iterator[Task]:
        rng = random.Random(f"structured/{seed}")
        kinds = list(DOCUMENT_KINDS)
        while True:
            doc = make_document(rng.choice(kinds), rng)
            schema_json = json.dumps(doc.schema, sort_keys=True)
            yield Task(  # the id (and so the split) follows the document, whatever its schema
                id=content_id("structured", f"{doc.kind}|{doc.text}"),
                domain=self.domain,
                messages=[{"role": "user", "content": render_prompt(doc)}],
                ground_truth={"schema": doc.schema, "reference": doc.reference},
                metadata={"kind": doc.kind, "n_fields": count_fields(doc.schema),
                          "closed_objects": schema_json.count('"additionalProperties": false')},
            )

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return take_split(self._candidates(seed), split, n or DEFAULT_N[split], lambda t: t.id)

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        payload = extract_json(final_answer_text(messages))
        if not payload.ok:
            return VerifyResult(0.0, {"format": 0.0, "correct": 0.0}, payload.reason)
        error = check_schema(payload.value, task.ground_truth["schema"])
        if error is not None:
            return VerifyResult(0.0, {"format": 1.0, "correct": 0.0}, f"schema_violation: {error}")
        return VerifyResult(1.0, {"format": 1.0, "correct": 1.0}, "valid")
