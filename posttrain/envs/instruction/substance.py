"""The substance rule: a reply must do the task, not only obey its formatting rules.

Constraints alone are gameable: "ok." is all lowercase, has no commas and at most 150 words, so it
scored 1.0 on 24 of 2,000 training tasks ("an email about school lunches, all lowercase, at most
150 words"). Both instruction environments therefore also require, with ``check_substance``:

1. **length**: at least ``min_words(constraints)`` words (``MIN_WORDS`` = 20, the length of two
   short sentences; lower only if a word-count rule of the task sets a smaller maximum). Every
   kind of text asked for (note, poem, summary, email, blog post, letter, speech, advice) needs
   more than a sentence.
2. **topic**: at least one of the task's topic words (``topic_words``: the content words of the
   topic's name, e.g. "school" and "lunches" for "school lunches"), case-insensitive, compared
   after removing one common ending (-ing, -ed, -es, -s, -er, then a final e), and a word of 4+
   letters may be a prefix of the other ("lunch" matches "lunches", "bake" "baking", "swim"
   "swimming", "bird" "birdwatching"). The topic's keywords do not count: keyword rules make
   replies include them, so a text about lighthouses that names "ticket" and "balcony" as asked
   is still not about old movie theaters.
3. **own words**: at least ``MIN_NEW_WORDS`` = 5 distinct words that do not occur in the user's
   turns, so the topic name repeated is not an answer;
4. **no echo**: no run of ``COPY_RUN`` = 10 consecutive words copied from the user's turns
   (case-insensitive), so the prompt with a sentence added is not an answer either (it scored 1.0
   on 47 of 2,000 training tasks with rules 1–3 alone). The longest phrase a rule asks to quote
   (an end phrase) is 8 words.

Words are ``\\w+`` runs, as in the constraints. The rule is a floor, not a judge of quality: 20
on-topic words of one's own pass it whatever they say. It is part of the reward, reported as the
``substance`` component, and the scripted writer's reference responses satisfy it (tested).
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from posttrain.envs.instruction.constraints import Check, Constraint, WordCount
from posttrain.envs.instruction.topics import TOPICS, Topic

MIN_WORDS = 20
MIN_NEW_WORDS = 5
COPY_RUN = 10
# Words of a topic's name that say nothing about the topic ("learning a new language").
_NAME_STOPWORDS = frozenset({"a", "an", "the", "of", "and", "new", "old", "local", "small", "public",
                             "home", "city", "learning", "visits", "nights", "night"})
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_TOPICS_BY_NAME = {t.name: t for t in TOPICS}


def _stem(word: str) -> str:
    w = word.lower()
    if len(w) > 4 and w.endswith("es") and w[-3] in "sxhz":
        return w[:-2]  # "lunches" → "lunch", "boxes" → "box"
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]  # "gardens" → "garden", "bees" → "bee"
    return w


def _root(word: str) -> str:
    """A crude root for topic matching: one common ending off, then a final "e"."""
    w = word.lower()
    for ending in ("ing", "ed", "es", "s", "er"):
        if w.endswith(ending) and len(w) - len(ending) >= 3:
            w = w[: -len(ending)]
            break
    return w[:-1] if len(w) > 3 and w.endswith("e") else w


def mentions(words: Iterable[str], topic: Sequence[str]) -> bool:
    """Does any of ``words`` name one of the ``topic`` words (rule 2 of the module docstring)?"""
    targets = {_root(w) for w in topic}
    for w in {_root(x) for x in words}:
        for t in targets:
            short, long_ = sorted((w, t), key=len)
            if w == t or (len(short) >= 4 and long_.startswith(short)):
                return True
    return False


def words_of(text: str) -> list[str]:
    return _WORD.findall(text)


def topic_words(topic: Topic | str | None) -> tuple[str, ...]:
    """The words that show a reply is about ``topic`` (a ``Topic`` or a topic name)."""
    if isinstance(topic, str):
        topic = _TOPICS_BY_NAME.get(topic) or Topic(topic, ())  # type: ignore[arg-type]
    if topic is None:
        return ()
    return tuple(dict.fromkeys(w for w in words_of(topic.name.lower()) if w not in _NAME_STOPWORDS and len(w) > 2))


def min_words(constraints: Iterable[Constraint]) -> int:
    """``MIN_WORDS``, or less when a word-count rule caps the reply lower than that."""
    caps = [c.high for c in constraints if isinstance(c, WordCount) and c.high is not None]
    return min([MIN_WORDS, *caps])


def check_substance(
    text: str, prompt: str, topic: Sequence[str], need_words: int = MIN_WORDS
) -> Check:
    """Does ``text`` address the request (rules 1–3 of the module docstring)?

    ``prompt``: the user turns' text; ``topic``: ``topic_words(...)`` (empty: rule 2 is skipped).
    """
    words = words_of(text)
    if len(words) < need_words:
        return Check(False, f"{len(words)} words; a reply that does the task needs at least {need_words}")
    stems = {_stem(w) for w in words}
    if topic and not mentions(words, topic):
        return Check(False, "does not mention the topic (none of: " + ", ".join(topic) + ")")
    prompt_stems = {_stem(w) for w in words_of(prompt)}
    new = stems - prompt_stems
    if len(new) < MIN_NEW_WORDS:
        return Check(False, f"only {len(new)} distinct words not taken from the prompt; needs {MIN_NEW_WORDS}")
    copied = copied_run(words, words_of(prompt))
    if copied:
        return Check(False, f"copies the prompt: {copied!r}")
    return Check(True, "addresses the request")


def copied_run(words: Sequence[str], prompt_words: Sequence[str], n: int = COPY_RUN) -> str:
    """The first run of ``n`` consecutive ``words`` that also occurs in ``prompt_words`` ("" if none)."""
    low = [w.lower() for w in words]
    grams = {tuple(x.lower() for x in prompt_words[i:i + n]) for i in range(len(prompt_words) - n + 1)}
    for i in range(len(low) - n + 1):
        if tuple(low[i:i + n]) in grams:
            return " ".join(words[i:i + n])
    return ""
