"""A scripted writer: builds a response about a topic that satisfies a given set of constraints.

Why it exists:
* the multi-turn environment needs plausible earlier assistant replies that obey the rules in force
  at their turn;
* it is a constructive proof that a sampled constraint combination is satisfiable: task generation
  keeps a combination only if ``write_response`` finds a text passing every check, so the conflict
  table cannot silently let an impossible task through;
* its output is a known-correct answer for tests and a seed reference for SFT.

How: each constraint's ``shape(draft)`` sets what it needs on a ``Draft`` (a title, N sections, a
P.S., a sentence holding placeholders...). ``render`` lays the draft out in a fixed order (content
sentences → blocks → bullets/end phrase → title/start phrase → P.S. → case → quotes). Counting
constraints (words, sentences, letters) are met by the fill loop: try 0, 1, 2, ... filler sentences
and return the first rendering that passes every check. The prose is template-made and repetitive;
it is meant to be correct, not good. It ignores the kind of text asked for (a "poem" comes out as
prose), so it is a stand-in for earlier turns, not a model of good answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Sequence

from posttrain.envs.instruction.constraints import Constraint
from posttrain.envs.instruction.topics import Topic

MAX_FILLERS = 40

# No commas, no all-capital words, no brackets/asterisks and nothing from FORBIDDEN_WORDS, so
# fillers never break a constraint that the draft's shape satisfied.
_FILLERS = (
    "People often talk about {topic}.",
    "There is always more to learn about {topic}.",
    "A careful look at {topic} reveals small details.",
    "Many readers first heard about {topic} from a friend.",
    "Stories about {topic} travel fast in small towns.",
    "Thinking about {topic} can change how we plan a week.",
    "Good planning makes every project easier.",
    "Small steps add up over time.",
    "Questions from readers are always welcome.",
    "It helps to start with one clear example.",
    "Each season brings something new to notice.",
    "Friends and neighbours can help along the way.",
    "Patience matters more than speed here.",
    "Try to keep a short record of what you see.",
    "Some of the best lessons come from mistakes.",
    "Sharing what you learn makes it stick.",
)
_KEYWORD_SENTENCES = (
    "The {kw} deserves a closer look.",
    "Everyone remembers the {kw}.",
    "A good story often starts with the {kw}.",
)
_BULLETS = (
    "Look closely at the {kw}.",
    "Ask an expert about {topic}.",
    "Share what you learn with friends.",
    "Keep notes as you go.",
    "Start small and stay curious.",
)
_CAPITAL_WORDS = ("NOTE", "KEY", "TODAY", "ALWAYS")
_PLACEHOLDERS = ("[name]", "[address]", "[date]")
_HIGHLIGHTS = ("*planning*", "*patience*", "*curiosity*")


@dataclass
class Draft:
    topic: Topic
    sentences: list[str] = field(default_factory=list)  # content every rendering must include
    blocks: int = 1  # paragraphs or sections
    block_separator: str = "\n\n"
    section_marker: str | None = None
    bullets: int = 0
    title: bool = False
    start: str | None = None
    end: str | None = None
    postscript: str | None = None
    case: str | None = None  # "lower" | "upper"
    no_commas: bool = False
    quote: bool = False
    as_json: bool = False

    def __post_init__(self) -> None:
        self.sentences.append(f"Here are a few thoughts about {self.topic.name}.")

    # ---- sentences that constraints ask for (see Constraint.shape)
    def keyword_sentences(self, keyword: str, count: int) -> list[str]:
        return [_KEYWORD_SENTENCES[i % len(_KEYWORD_SENTENCES)].format(kw=keyword) for i in range(count)]

    def capital_sentence(self, count: int) -> str:
        return "Keep these words in mind: " + " ".join(_CAPITAL_WORDS[:count]) + "."

    def placeholder_sentence(self, count: int) -> str:
        return "Please write to " + " about ".join(_PLACEHOLDERS[:count]) + " with any questions."

    def highlight_sentence(self, count: int) -> str:
        return "What matters most: " + " and ".join(_HIGHLIGHTS[:count]) + "."

    # ---- layout
    def fillers(self) -> list[str]:
        return [_FILLERS[i % len(_FILLERS)].format(topic=self.topic.name) for i in range(MAX_FILLERS)]

    def render(self, fillers: Sequence[str]) -> str:
        # Interleave fillers with the required sentences so content spreads over the blocks.
        sentences = [self.sentences[0]]
        rest, extra = self.sentences[1:], list(fillers)
        while rest or extra:
            if extra:
                sentences.append(extra.pop(0))
            if rest:
                sentences.append(rest.pop(0))
        text = self._render_json(sentences) if self.as_json else self._render_prose(sentences)
        if self.case == "lower":
            text = text.lower()
        elif self.case == "upper":
            text = text.upper()
        if self.no_commas:
            text = text.replace(",", "")
        return f'"{text}"' if self.quote else text

    def _render_json(self, sentences: list[str]) -> str:
        return json.dumps({"title": self.topic.title, "text": " ".join(sentences)}, ensure_ascii=False)

    def _render_prose(self, sentences: list[str]) -> str:
        size, extra = divmod(len(sentences), self.blocks)
        blocks, i = [], 0
        for b in range(self.blocks):
            n = size + (b < extra)
            blocks.append(" ".join(sentences[i:i + n]))
            i += n
        if self.section_marker:
            blocks = [f"{self.section_marker} {b + 1}\n{text}" for b, text in enumerate(blocks)]
        tail: list[str] = []
        if self.bullets:
            kw = self.topic.keywords[0]
            tail += ["* " + _BULLETS[j].format(kw=kw, topic=self.topic.name) for j in range(self.bullets)]
        if self.end:
            tail.append(self.end)
        if tail:
            blocks[-1] = "\n".join([blocks[-1], *tail]).strip()
        head = [f"{self.start}."] if self.start else []
        if self.title:
            head.append(f"<<{self.topic.title}>>")
        if head:
            blocks[0] = "\n".join([*head, blocks[0]])
        text = self.block_separator.join(blocks)
        if self.postscript:
            text += f"\n\n{self.postscript} Thanks for reading about {self.topic.name}."
        return text


def write_response(
    topic: Topic, constraints: Sequence[Constraint], accept: Callable[[str], bool] | None = None
) -> str | None:
    """The shortest scripted response passing every constraint (and ``accept``, when given, e.g.
    the substance rule), or None if the fill loop fails."""
    draft = Draft(topic)
    for c in constraints:
        c.shape(draft)
    fillers = draft.fillers()
    for k in range(max(0, draft.blocks - len(draft.sentences)), MAX_FILLERS + 1):  # no empty block
        text = draft.render(fillers[:k])
        if all(c.check(text) for c in constraints) and (accept is None or accept(text)):
            return text
    return None
