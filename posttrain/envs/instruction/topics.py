"""Base requests for the instruction-following environments: topic × kind of text × audience.

Small templates, combined by the seeded generator (35 topics × 8 kinds of text × 7 audiences ≈ 2k
base requests before any constraint is added). Each topic carries three concrete nouns that the
keyword constraint asks for, so "include the word 'lamp'" reads naturally in a note about
lighthouses; all of them are lowercase single words and none is in ``FORBIDDEN_WORDS``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    name: str  # as it reads after "about": "lighthouses", "sourdough baking"
    keywords: tuple[str, str, str]

    @property
    def title(self) -> str:
        return self.name.title()


TOPICS = tuple(Topic(name, tuple(kw.split())) for name, kw in (  # type: ignore[arg-type]
    ("lighthouses", "lamp coast keeper"),
    ("community gardens", "soil seeds compost"),
    ("night trains", "sleeper station ticket"),
    ("honey bees", "hive pollen queen"),
    ("public libraries", "shelf librarian card"),
    ("mountain hiking", "trail summit boots"),
    ("sourdough baking", "starter flour oven"),
    ("city cycling", "helmet lane bicycle"),
    ("rainwater harvesting", "barrel gutter tank"),
    ("board game nights", "dice cards table"),
    ("street markets", "stall vendor bargain"),
    ("learning a new language", "grammar vocabulary accent"),
    ("home composting", "worms scraps bin"),
    ("amateur astronomy", "telescope planet orbit"),
    ("volunteer firefighters", "hose siren training"),
    ("river cleanups", "gloves litter current"),
    ("old movie theaters", "projector ticket balcony"),
    ("birdwatching", "binoculars feather nest"),
    ("school lunches", "tray menu nutrition"),
    ("solar panels", "roof battery sunlight"),
    ("tea ceremonies", "kettle cup ritual"),
    ("winter swimming", "towel lake courage"),
    ("local radio stations", "microphone studio signal"),
    ("knitting clubs", "yarn needles pattern"),
    ("urban beekeeping", "rooftop hive honey"),
    ("ferry commutes", "deck harbor schedule"),
    ("chess tournaments", "clock opening knight"),
    ("small bookshops", "owner shelf novel"),
    ("recycling electronics", "battery circuit metal"),
    ("family recipes", "kitchen spice notebook"),
    ("morning routines", "alarm coffee habit"),
    ("museum visits", "gallery exhibit guide"),
    ("weather forecasting", "pressure cloud radar"),
    ("music lessons", "piano scale teacher"),
    ("neighborhood festivals", "parade lantern music"),
))

# Kinds of text, each a template for the request sentence ("{topic}", "{audience}").
FORMS = {
    "note": "Write a short note about {topic} {audience}.",
    "poem": "Write a poem about {topic} {audience}.",
    "summary": "Write a short summary of what people should know about {topic} {audience}.",
    "email": "Write an email about {topic} {audience}.",
    "blog_post": "Write a short blog post about {topic} {audience}.",
    "letter": "Write a letter to a friend about {topic} {audience}.",
    "speech": "Write a short speech about {topic} {audience}.",
    "advice": "Give some practical advice about {topic} {audience}.",
}

AUDIENCES = (
    "for a group of students", "for your neighbours", "for a local newsletter",
    "for a friend who is new to the subject", "for a team of volunteers", "for young children",
    "for a busy parent",
)

TONES = ("cheerful", "formal", "calm", "enthusiastic", "humorous", "serious")


@dataclass(frozen=True)
class Request:
    topic: Topic
    form: str
    audience: str

    @property
    def text(self) -> str:
        return FORMS[self.form].format(topic=self.topic.name, audience=self.audience)


def sample_request(rng: random.Random) -> Request:
    return Request(rng.choice(TOPICS), rng.choice(sorted(FORMS)), rng.choice(AUDIENCES))
