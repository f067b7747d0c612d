"""Project-made LoCoMo-format conversations, and the dev-data layout written from them.

:func:`locomo_like_records` writes small chat conversations in LoCoMo's
``locomo10.json`` record format (speakers, dated sessions, dialogue ids, image captions,
LoCoMo's own session summaries, questions of the five categories with ``D3:5``
evidence).  Their shapes follow the real dev conversations the tests were written on:
ids ``conv-26``, ``conv-30`` (19 sessions, 105 questions) and ``conv-41``, so a test
that asserts counts holds on either.  The text comes from templates over a few hobby
topics; every question is answered by a planted sentence.

:func:`write_dev_layout` turns LoCoMo records (these, or the three dev conversations
of the official file) into the folder layout that :mod:`.paths` describes: the list
file, one flat file per conversation, and the first conversation in LongMemEval's
format.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Sequence

from .._io import atomic_write

__all__ = ["DEV_IDS", "locomo_like_records", "to_flat", "to_longmemeval",
           "write_dev_layout"]

DEV_IDS = ("conv-26", "conv-30", "conv-41")
#: conversation id → (speaker a, speaker b, sessions, questions, last session's date);
#: speakers and the last date as in the real conversation of that id
SHAPES = {
    "conv-26": ("Caroline", "Melanie", 19, 80, "9:55 am on 22 October, 2023"),
    "conv-30": ("Jon", "Gina", 19, 105, "2:13 pm on 16 November, 2023"),
    "conv-41": ("John", "Maria", 32, 60, "5:24 pm on 7 January, 2024"),
}
# topic → (past verb, base verb, objects, places), from standin_topics.json beside this module
with open(Path(__file__).with_name("standin_topics.json"), encoding="utf-8") as _f:
    TOPICS = {k: (v[0], v[1], tuple(v[2]), tuple(v[3])) for k, v in json.load(_f).items()}
_OPEN = ("Guess what?", "Big news!", "You won't believe it.", "So, this week", "Oh, and")
_REACT = ("That sounds amazing,", "Wow, well done,", "How lovely,", "No way,", "Brilliant,")
_ASK = ("How did you feel about {o}?", "Was {o} hard to do?", "Would you do {o} again?",
        "Who was with you for {o}?")
_FEEL = ("exhausting but fun", "so relaxing", "a bit scary at first", "really rewarding",
         "better than I expected")
_FILL = ("Work has been busy but I'm trying to rest more.",
         "The weather turned cold again, so I stayed in with tea.",
         "My sister visited and we talked for hours.",
         "I'm reading a mystery novel before bed these days.")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_DAYS = ("on Monday", "on Saturday", "last weekend", "yesterday", "on Friday evening")


def _date(rng: random.Random, day: int) -> str:
    month, dom = divmod(day, 28)
    hour, minute = rng.randint(1, 12), rng.randrange(60)
    return (f"{hour}:{minute:02d} {rng.choice(('am', 'pm'))} on {dom + 1} "
            f"{_MONTHS[month % 12]}, {2023 + month // 12}")


def _record(cid: str, seed: int) -> dict:
    a, b, n_sessions, n_questions, last = SHAPES[cid]
    rng = random.Random(f"{seed}-{cid}")
    conv: dict = {"speaker_a": a, "speaker_b": b}
    summaries, events, observations = {}, {}, {}
    facts = []  # (speaker, topic, object, place, date, dia_id)
    day = rng.randrange(20)  # 28-day months from January 2023; at most ~Sept 2023
    for s in range(1, n_sessions + 1):
        day += rng.randint(3, 9)
        date = _date(rng, day) if s < n_sessions else last
        turns, told = [], []
        speakers = (a, b) if s % 2 else (b, a)

        def say(speaker, text, **extra):
            turns.append({"speaker": speaker, "dia_id": f"D{s}:{len(turns) + 1}",
                          "text": text, **extra})

        say(speakers[0], f"Hi {speakers[1]}! {rng.choice(_FILL)}")
        for k, topic in enumerate(rng.sample(sorted(TOPICS), 4)):
            past, _, objects, places = TOPICS[topic]
            who, other = speakers[k % 2], speakers[(k + 1) % 2]
            obj, place = rng.choice(objects), rng.choice(places)
            extra = {}
            if rng.random() < 0.25:
                extra = {"blip_caption": f"a photo of {obj} at a {place}",
                         "query": f"{topic} {place}"}
            say(who, f"{rng.choice(_OPEN)} I {past} {obj} at the {place} "
                     f"{rng.choice(_DAYS)}, my first {topic} outing in months.", **extra)
            facts.append((who, topic, obj, place, date, turns[-1]["dia_id"]))
            told.append(f"{who} {past} {obj} at the {place}.")
            say(other, f"{rng.choice(_REACT)} {who}! " + rng.choice(_ASK).format(o=obj))
            say(who, f"It was {rng.choice(_FEEL)}. We stayed about {rng.randint(2, 9)} hours "
                     f"and I want to go back to the {place} soon.")
        say(speakers[1], f"Talk soon! {rng.choice(_FILL)}")
        conv[f"session_{s}_date_time"] = date
        conv[f"session_{s}"] = turns
        summaries[f"session_{s}_summary"] = (f"{a} and {b} talked on {date}. "
                                             + " ".join(told))
        events[f"events_session_{s}"] = {a: [t for t in told if t.startswith(a)],
                                         b: [t for t in told if t.startswith(b)],
                                         "date": date}
        observations[f"session_{s}_observation"] = {
            who: [[f"{who} enjoys {topic}.", dia]] for who, topic, *_, dia in facts[-4:]}
    return {"qa": _questions(rng, facts, n_questions, (a, b)), "conversation": conv,
            "event_summary": events, "observation": observations,
            "session_summary": summaries, "sample_id": cid}


def _questions(rng: random.Random, facts: list, n: int, speakers: tuple) -> list[dict]:
    qa = []
    for i in range(n):
        category = (2, 1, 2, 3, 4, 1, 5, 4)[i % 8]
        who, topic, obj, place, date, dia = facts[rng.randrange(len(facts))]
        _, base, _, _ = TOPICS[topic]
        if category == 1:  # two facts of one speaker
            other = [f for f in facts if f[0] == who and f[5] != dia]
            f2 = rng.choice(other)
            q = {"question": f"Where did {who} go for {topic} and for {f2[1]}?",
                 "answer": f"the {place} and the {f2[3]}", "evidence": [dia, f2[5]]}
        elif category == 2:
            q = {"question": f"When did {who} {base} {obj}?", "answer": date.split(" on ")[1],
                 "evidence": [dia]}
        elif category == 3:
            q = {"question": f"Would {who} enjoy a weekend of {topic} at the {place}?",
                 "answer": f"Likely yes, {who} {TOPICS[topic][0]} {obj} there.",
                 "evidence": [dia]}
        elif category == 4:
            q = {"question": f"What did {who} {base} at the {place}?", "answer": obj,
                 # an entry the reference cannot parse, as LoCoMo itself has
                 "evidence": [dia, "D8:6; D9:17"] if i == 4 else [dia]}
        else:
            liar = speakers[1] if who == speakers[0] else speakers[0]
            q = {"question": f"What did {liar} {base} at the {place}?",
                 "adversarial_answer": obj, "evidence": [dia]}
        q["category"] = category
        qa.append(q)
    return qa


def locomo_like_records(seed: int = 0) -> list[dict]:
    """The three project-made conversations as ``locomo10.json`` records."""
    return [_record(cid, seed) for cid in DEV_IDS]


def to_flat(rec: dict) -> dict:
    """A ``locomo10.json`` record in the flat one-file-per-conversation layout."""
    flat = dict(rec["conversation"])
    flat.update(rec.get("event_summary", {}))
    flat["qa"] = rec["qa"]
    flat.update(rec.get("observation", {}))
    flat.update(rec.get("session_summary", {}))
    return flat


_DIA = re.compile(r"^D(\d+):(\d+)$")
_LME_TYPES = {1: "multi-session", 2: "temporal-reasoning", 3: "single-session-preference"}


def to_longmemeval(rec: dict, n_questions: int = 40) -> list[dict]:
    """One LoCoMo conversation as LongMemEval instances: its first ``n_questions``
    questions of categories 1-3 with evidence, each over the whole conversation as
    haystack (the shape of the LongMemEval-format sample the tests were written on)."""
    conv = rec["conversation"]
    num = rec["sample_id"].split("-")[-1]
    keys = sorted((int(k.split("_")[1]) for k in conv
                   if k.startswith("session_") and k.count("_") == 1))
    dates = [conv[f"session_{n}_date_time"] for n in keys]
    out = []
    for i, q in enumerate(rec["qa"]):
        if q.get("category") not in _LME_TYPES or "answer" not in q:
            continue
        evidence = q.get("evidence", [])
        dia = set(evidence)
        gold = list(dict.fromkeys(int(m.group(1)) for e in evidence
                                  if isinstance(e, str) and (m := _DIA.match(e))))
        if not gold:
            continue
        gold_ids = sorted(f"locomo{num}_session_{n}" for n in gold)  # as strings
        sessions = [[{"role": "user" if t["speaker"] == conv["speaker_a"] else "assistant",
                      "content": t["text"], **({"has_answer": True} if t["dia_id"] in dia
                                               else {})}
                     for t in conv[f"session_{n}"]] for n in keys]
        out.append({
            "question_id": f"locomo{num}_q{i}", "question_type": _LME_TYPES[q["category"]],
            "question": q["question"], "answer": str(q["answer"]), "question_date": dates[-1],
            "haystack_dates": dates,
            "haystack_session_ids": [("answer_" if n in gold else "") + f"locomo{num}_session_{n}"
                                     for n in keys],
            "haystack_sessions": sessions, "answer_session_ids": gold_ids})
        if len(out) == n_questions:
            break
    return out


def write_dev_layout(records: Sequence[dict], out: Path) -> Path:
    """Write the dev-data layout of :mod:`.paths` under ``out`` from LoCoMo records."""
    out = Path(out)
    with atomic_write(out / "locomo" / "locomo_dev.json", "w", encoding="utf-8") as f:
        json.dump(list(records), f)
    for rec in records:
        num = rec["sample_id"].split("-")[-1]
        with atomic_write(out / "locomo" / "v2" / f"{num}.json", "w", encoding="utf-8") as f:
            json.dump(to_flat(rec), f)
    with atomic_write(out / "longmemeval_format_sample.json", "w", encoding="utf-8") as f:
        json.dump(to_longmemeval(records[0]), f)
    return out
