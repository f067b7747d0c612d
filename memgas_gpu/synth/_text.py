"""A small template grammar that renders user/assistant chat messages.

Templates are sentences with ``{slot}`` placeholders; a slot is looked up first in
the session's topic vocabulary, then in :data:`~._vocab.COMMON` (a trailing digit,
as in ``{thing2}``, draws again from the same list).  Templates are parsed once;
rendering is a handful of ``random.choice`` calls per sentence, fast enough to
render the LongMemEval-M pool (millions of words) in seconds.
"""
from __future__ import annotations

import random
import re
from typing import Optional, Sequence

from ._vocab import COMMON, TOPICS

__all__ = ["Grammar", "Template"]

USER_TEMPLATES = [
    "I have been {ger} a lot lately and I am feeling {feel} about it.",
    "My {relation} {name} suggested I look into {thing}, what do you think?",
    "Last {weekday} I spent about {num} hours {ger} and it went better than I expected.",
    "Do you have any tips for {ger} without spending too much money?",
    "I was at {place} {when} and saw {thing} for around {price} dollars.",
    "Honestly I am not sure whether {thing} or {thing2} would be better for me.",
    "I usually do this on {weekday} evenings after dinner, when things are quiet.",
    "{name} and I talked about {ger} {when}, and now I want to give it a real try.",
    "Is it normal for {ger} to feel this hard in the first few weeks?",
    "I would like a simple plan I can follow for the next {num} weeks.",
    "The last time I tried {ger} it did not go well, so I want to do it properly this time.",
    "Could you explain the difference between {thing} and {thing2} in plain terms?",
    "My budget is about {price} dollars, so I need to be a bit careful.",
    "I might be in {city} next month, so anything I can do there would be great.",
    "It has been a long week, and {ger} is the one thing that helps me relax.",
    "Can you give me a short checklist before I head to {place}?",
    "I keep putting off {ger} because I never know where to begin.",
    "What would you say is the most common mistake people make with {thing}?",
]

ASSISTANT_TEMPLATES = [
    "When it comes to {ger}, the most important thing is to {tip}.",
    "Here is a simple approach: first, look at {thing}; second, try {ger} at {place}; finally, {tip}.",
    "Many people find that {thing} makes a big difference, especially in the first {num} weeks.",
    "If your budget is around {price} dollars, you could compare {thing} with {thing2}.",
    "It is completely normal for {ger} to feel awkward at first, so be patient with yourself.",
    "A good rule of thumb is to {tip}, and then adjust as you learn what works for you.",
    "You might also check {place}, since they often have {thing} and friendly staff.",
    "I would suggest setting aside about {num} hours a week for {ger}.",
    "One option is {thing}, which is {qual} but worth it if you plan to keep going.",
    "Try not to do everything at once; it usually helps to {tip}.",
    "If you are in {city}, people there often recommend {ger} on a {weekday} morning.",
    "Keep in mind that {thing} can be {qual}, so read a few reviews before deciding.",
    "Let me know how it goes, and we can adjust the plan for {ger} together.",
    "As a next step, write down {num} small goals and check them off each {weekday}.",
    "In short: {tip}, stay consistent, and enjoy the process of {ger}.",
    "Another idea is to invite {name} or another {relation} to join you, which keeps you motivated.",
]

_SLOT = re.compile(r"\{(\w+?)\d?\}")


class Template:
    """A parsed sentence template: literal pieces interleaved with slot names."""

    __slots__ = ("literals", "slots")

    def __init__(self, text: str) -> None:
        parts = _SLOT.split(text)
        self.literals: tuple[str, ...] = tuple(parts[0::2])
        self.slots: tuple[str, ...] = tuple(parts[1::2])

    def render(self, rng: random.Random, vocab: dict[str, list[str]]) -> str:
        """Fill every slot with a random choice from ``vocab``; capitalise the result."""
        choice = rng.choice
        lits = self.literals
        out = [lits[0]]
        for i, slot in enumerate(self.slots):
            out.append(choice(vocab[slot]))
            out.append(lits[i + 1])
        s = "".join(out)
        return s[:1].upper() + s[1:]


class Grammar:
    """Renders messages and sessions for the topics of :data:`~._vocab.TOPICS`."""

    def __init__(self) -> None:
        self.user = [Template(t) for t in USER_TEMPLATES]
        self.assistant = [Template(t) for t in ASSISTANT_TEMPLATES]
        self.vocab = {name: {**COMMON, **topic} for name, topic in TOPICS.items()}
        for name, v in self.vocab.items():
            for tpl in self.user + self.assistant:
                missing = [s for s in tpl.slots if s not in v]
                if missing:  # pragma: no cover - a vocabulary authoring error
                    raise KeyError(f"topic {name!r} lacks slots {missing}")

    def message(self, rng: random.Random, topic: str, role: str, words: int,
                planted: Optional[str] = None) -> str:
        """One message of about ``words`` words (sentences until the target is nearest).

        Args:
            rng: the random stream.
            topic: a key of :data:`~._vocab.TOPICS`.
            role: ``"user"`` or ``"assistant"`` (picks the template set).
            words: target word count; the message stops at the sentence boundary
                closest to it (always at least one sentence).
            planted: an extra sentence to place at a random position among the others
                (it counts towards ``words``).
        """
        vocab = self.vocab[topic]
        templates = self.user if role == "user" else self.assistant
        sentences: list[str] = []
        count = 0
        if planted is not None:
            count = planted.count(" ") + 1
        if rng.random() < 0.3:
            s = rng.choice(vocab["opener" if role == "user" else "ack"])
            sentences.append(s)
            count += s.count(" ") + 1
        while True:
            s = rng.choice(templates).render(rng, vocab)
            n = s.count(" ") + 1
            if (sentences or planted is not None) and count + n - words > words - count:
                break
            sentences.append(s)
            count += n
        if planted is not None:
            sentences.insert(rng.randrange(min(1, len(sentences)), len(sentences) + 1), planted)
        return " ".join(sentences)

    def session(self, rng: random.Random, topic: str, turns: int, words: int,
                planted: Optional[Sequence[tuple[int, str]]] = None,
                flag: bool = True) -> list[dict]:
        """A session of ``turns`` messages alternating user/assistant, user first.

        Args:
            rng: the random stream.
            topic: a key of :data:`~._vocab.TOPICS`.
            turns: number of messages.
            words: about how many words per message (jittered +-25% per message).
            planted: ``(message_index, sentence)`` pairs; that message carries the
                sentence and gets ``"has_answer": true``.
            flag: set ``has_answer`` on planted messages (False for distractors).
        """
        plant = dict(planted or ())
        msgs = []
        for j in range(turns):
            role = "user" if j % 2 == 0 else "assistant"
            target = max(1, round(words * rng.uniform(0.75, 1.25)))
            sentence = plant.get(j)
            msg = {"role": role, "content": self.message(rng, topic, role, target, sentence)}
            if sentence is not None and flag:
                msg["has_answer"] = True
            msgs.append(msg)
        return msgs
