"""Planted facts: one question, its answer and the evidence sentences behind it.

Each question type of LongMemEval has a few schemas.  A schema draws its slots and
returns a :class:`Fact`: the question (worded to overlap the planted sentences, so a
lexical or dense retriever can find them), the answer, the topic of the evidence
sessions and one planted ``(role, sentence)`` per evidence session in chronological
order.  Abstention variants ask about something the history does not contain (a
sibling entity), as LongMemEval's ``_abs`` questions do.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Union

__all__ = ["Fact", "QUESTION_TYPES", "make_fact", "evidence_count"]

QUESTION_TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "temporal-reasoning",
    "knowledge-update",
)

NOT_ENOUGH = "The information provided is not enough."
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


@dataclass
class Fact:
    """A planted fact.

    Attributes:
        question: the question text.
        answer: the answer, or a function of the evidence sessions' datetimes
            (temporal questions, whose answer depends on the haystack's dates).
        topic: vocabulary topic of the evidence sessions.
        plants: one ``(role, sentence)`` per evidence session, oldest first.
    """

    question: str
    answer: Union[str, Callable[[list[datetime]], str]]
    topic: str
    plants: list[tuple[str, str]]


def evidence_count(qtype: str, rng: random.Random) -> int:
    """How many evidence sessions a question of ``qtype`` gets (1-3)."""
    if qtype == "multi-session":
        return rng.choice((2, 3))
    if qtype in ("temporal-reasoning", "knowledge-update"):
        return 2
    return 1


def _two(rng: random.Random, items: list):
    a, b = rng.sample(items, 2)
    return a, b


# ---- single-session-user: the user states a fact; the question asks it back ----------
def _ssu(rng: random.Random, n: int, abs_: bool) -> Fact:
    k = rng.randrange(5)
    month = rng.choice(MONTHS)
    if k == 0:
        breed = rng.choice(["beagle", "border collie", "golden retriever", "dachshund", "corgi",
                            "labrador", "shiba inu", "greyhound"])
        pet = rng.choice(["Biscuit", "Pepper", "Mochi", "Ziggy", "Olive", "Rufus", "Luna"])
        other = "cat" if abs_ else "dog"
        return Fact(f"What breed is the {other} I adopted in {month}?",
                    f"{NOT_ENOUGH} You mentioned adopting a dog, not a cat." if abs_ else breed,
                    "pets", [("user", f"By the way, I adopted a {breed} dog named {pet} in "
                                      f"{month}, and he is settling in nicely.")])
    if k == 1:
        place, other = _two(rng, ["downtown office", "hospital", "university campus",
                                  "warehouse", "design studio", "law firm"])
        mins = rng.choice(range(15, 95, 5))
        return Fact(f"How long is my daily commute to the {other if abs_ else place}?",
                    f"{NOT_ENOUGH} You only mentioned your commute to the {place}." if abs_
                    else f"About {mins} minutes each way",
                    "work", [("user", f"My daily commute to the {place} takes about {mins} "
                                      "minutes each way, which is honestly exhausting.")])
    if k == 2:
        item, other = _two(rng, ["espresso machine", "mountain bike", "sofa", "tablet",
                                 "air fryer", "electric toothbrush", "gaming monitor"])
        store = rng.choice(["Costco", "Target", "IKEA", "Best Buy", "a local shop on Elm Street",
                            "an outlet in {0}".format(rng.choice(["Denver", "Austin", "Boston"]))])
        return Fact(f"Where did I buy my new {other if abs_ else item}?",
                    f"{NOT_ENOUGH} You mentioned buying a {item}, not a {other}." if abs_ else store,
                    "shopping", [("user", f"I finally bought a new {item} at {store} last "
                                          "weekend and I really love it.")])
    if k == 3:
        inst, other = _two(rng, ["cello", "ukulele", "saxophone", "violin", "harmonica",
                                 "banjo", "trumpet"])
        teacher = rng.choice(["Mrs. Alvarez", "a teacher named Colin", "an online course",
                              "my neighbor Ruth"])
        return Fact(f"Who is teaching me to play the {other if abs_ else inst}?",
                    f"{NOT_ENOUGH} You only mentioned learning the {inst}." if abs_ else teacher,
                    "hobbies", [("user", f"I started learning to play the {inst} in {month}, "
                                         f"and {teacher} is teaching me every week.")])
    city, other = _two(rng, ["Reykjavik", "Marrakech", "Hanoi", "Cape Town", "Lima", "Tbilisi",
                             "Porto", "Santiago"])
    occasion = rng.choice(["anniversary", "birthday", "honeymoon", "graduation"])
    days = rng.choice(range(3, 15))
    return Fact(f"How many days did I spend in {other if abs_ else city} on my {occasion} trip?",
                f"{NOT_ENOUGH} You mentioned a trip to {city}, not {other}." if abs_
                else f"{days} days",
                "travel", [("user", f"For my {occasion} trip I spent {days} days in {city}, "
                                    "and the food there was amazing.")])


# ---- single-session-assistant: the assistant said it; the user asks it back ----------
def _ssa(rng: random.Random, n: int, abs_: bool) -> Fact:
    k = rng.randrange(3)
    if k == 0:
        ing, other = _two(rng, ["chickpeas", "eggplant", "salmon", "lentils", "mushrooms",
                                "butternut squash", "tofu"])
        dish = rng.choice(["a lemon herb stew", "a coconut curry", "a sheet pan bake",
                           "a Moroccan tagine", "a miso glazed stir fry", "a Greek style salad"])
        mins = rng.choice(range(20, 65, 5))
        return Fact(f"You recommended a dinner recipe when I asked what to cook with {other if abs_ else ing}; "
                    "what was the dish?",
                    f"{NOT_ENOUGH} The recipe we discussed used {ing}, not {other}." if abs_ else dish,
                    "cooking", [("assistant", f"Since you have {ing} on hand, I recommend {dish} "
                                              f"as a dinner recipe; it takes about {mins} minutes.")])
    if k == 1:
        city, other = _two(rng, ["Denver", "Seattle", "Vancouver", "Edinburgh", "Kyoto",
                                 "Melbourne", "Portland"])
        trail = rng.choice(["Eagle Ridge Trail", "Cedar Falls Loop", "Bluebell Canyon Path",
                            "Fox Hollow Trail", "Granite Lake Loop"])
        miles = rng.choice(range(3, 13))
        return Fact(f"Which hiking trail near {other if abs_ else city} did you recommend to me?",
                    f"{NOT_ENOUGH} I recommended a trail near {city}, not {other}." if abs_ else trail,
                    "travel", [("assistant", f"For a hiking trail near {city}, I recommend the "
                                             f"{trail}, a {miles} mile loop with great views.")])
    subject, other = _two(rng, ["personal finance", "astronomy", "urban gardening",
                                "behavioral psychology", "bread baking", "photography"])
    book = rng.choice(["The Quiet Method", "Small Steps Every Day", "A Field Guide to Curiosity",
                       "The Patient Beginner", "Learning in Public"])
    return Fact(f"What book did you recommend for learning about {other if abs_ else subject}?",
                f"{NOT_ENOUGH} I recommended a book about {subject}, not {other}." if abs_
                else book,
                "media", [("assistant", f"For learning about {subject}, I recommend the book "
                                        f"{book}; it is clear, practical and short.")])


# ---- single-session-preference: a stated preference should shape a recommendation ----
def _ssp(rng: random.Random, n: int, abs_: bool) -> Fact:
    k = rng.randrange(3)
    if k == 0:
        hobby, other = _two(rng, ["video editing", "digital illustration", "music production",
                                  "woodworking", "bird photography"])
        tool = rng.choice(["Adobe Premiere Pro", "Procreate", "Ableton Live", "a Nikon Z50",
                           "hand tools from my grandfather"])
        q = other if abs_ else hobby
        return Fact(f"Can you recommend some resources where I can learn more about {q}?",
                    f"{NOT_ENOUGH} You mentioned {hobby}, not {other}." if abs_ else
                    f"The user would prefer resources about {hobby} that work with {tool}, "
                    "which they said they use.",
                    "hobbies", [("user", f"I have been getting into {hobby} lately, mostly "
                                         f"using {tool} on weekends.")])
    if k == 1:
        cuisine = rng.choice(["Thai", "Mexican", "Indian", "Japanese", "Ethiopian", "Italian"])
        ing = rng.choice(["fresh herbs", "lime", "chili", "garlic", "ginger", "roasted peppers"])
        meal = "brunch" if abs_ else "dinner"
        return Fact(f"Can you suggest a {meal} recipe I could cook this weekend?",
                    f"{NOT_ENOUGH} You described your dinner preferences, not brunch." if abs_ else
                    f"The user would prefer {cuisine} dinner recipes with {ing}.",
                    "cooking", [("user", f"For dinner I cook {cuisine} recipes almost every "
                                         f"weekend, especially anything with lots of {ing}.")])
    lodging = rng.choice(["small guesthouses", "cabins", "family run inns", "campsites"])
    kind = rng.choice(["mountain", "beach", "countryside", "lake"])
    season = "winter" if abs_ else "summer"
    return Fact(f"Any tips for planning my next {kind} vacation this {season}?",
                f"{NOT_ENOUGH} You described summer vacation preferences only." if abs_ else
                f"The user would prefer a {kind} vacation staying in {lodging}, not big hotels.",
                "travel", [("user", f"For a {kind} vacation in summer I always prefer staying "
                                    f"in {lodging} rather than big hotels.")])


# ---- multi-session: aggregate over several evidence sessions -------------------------
def _ms(rng: random.Random, n: int, abs_: bool) -> Fact:
    k = rng.randrange(3)
    if k == 0:
        plants = rng.sample(["basil", "tomato plants", "succulents", "lavender", "ferns",
                             "pepper plants", "orchids"], n)
        counts = [rng.randrange(2, 9) for _ in range(n)]
        where = "backyard" if abs_ else "balcony"
        return Fact(f"How many plants have I bought for my {where} garden in total?",
                    f"{NOT_ENOUGH} You only mentioned plants for your balcony garden." if abs_
                    else str(sum(counts)),
                    "garden", [("user", f"I bought {c} {p} plants for my balcony garden "
                                        f"{rng.choice(['today', 'this morning', 'yesterday'])}.")
                               for c, p in zip(counts, plants)])
    if k == 1:
        hobby = "skiing" if abs_ else "cycling"
        gear = rng.sample(["helmet", "pair of gloves", "bike light", "saddle", "rain jacket",
                           "water bottle cage", "bike lock"], n)
        costs = [rng.randrange(15, 180) for _ in range(n)]
        return Fact(f"How much money have I spent on {hobby} gear so far?",
                    f"{NOT_ENOUGH} You mentioned cycling gear, not skiing gear." if abs_
                    else f"${sum(costs)}",
                    "shopping", [("user", f"I spent ${c} on a new {g} as cycling gear today.")
                                 for c, g in zip(costs, gear)])
    events = rng.sample(["a jazz concert", "a pottery workshop", "a wine tasting", "a charity run",
                         "a comedy show", "a photography meetup", "a poetry reading"], n)
    kind = "conferences" if abs_ else "events"
    return Fact(f"How many weekend {kind} did I attend with my friend {'Rosa' if n == 2 else 'Theo'}?",
                f"{NOT_ENOUGH} You mentioned weekend events, not conferences." if abs_ else
                f"{n} ({', '.join(e[2:] if e.startswith('a ') else e for e in events)})",
                "hobbies", [("user", f"This weekend I attended {e} with my friend "
                                     f"{'Rosa' if n == 2 else 'Theo'}.") for e in events])


# ---- temporal-reasoning: the answer depends on the evidence sessions' dates ----------
_EVENTS = [("started my pottery class", "starting my pottery class"),
           ("got my car serviced", "getting my car serviced"),
           ("moved into my new apartment", "moving into my new apartment"),
           ("ran my first half marathon", "running my first half marathon"),
           ("renewed my passport", "renewing my passport"),
           ("finished painting the nursery", "finishing painting the nursery"),
           ("joined the chess club", "joining the chess club"),
           ("bought my first electric scooter", "buying my first electric scooter")]


def _tr(rng: random.Random, n: int, abs_: bool) -> Fact:
    (a_past, a_ger), (b_past, b_ger), (c_past, c_ger) = rng.sample(_EVENTS, 3)
    plants = [("user", f"Guess what, I {a_past} today, it feels great to have it done."),
              ("user", f"Quick update: I {b_past} today, finally.")]
    if rng.randrange(2):
        second = c_past if abs_ else b_past

        def days(dates: list[datetime]) -> str:
            if abs_:
                return f"{NOT_ENOUGH} You did not mention when you {c_past}."
            return f"{(dates[1].date() - dates[0].date()).days} days"

        return Fact(f"How many days passed between when I {a_past} and when I {second}?",
                    days, "home", plants)
    first, second = rng.sample([a_ger, c_ger if abs_ else b_ger], 2)
    answer = (f"{NOT_ENOUGH} You did not mention {c_ger}." if abs_
              else f"{a_ger[0].upper()}{a_ger[1:]} came first")
    return Fact(f"Which happened first, {first} or {second}?", answer, "home", plants)


# ---- knowledge-update: a later session changes the value; ask for the current one ----
def _ku(rng: random.Random, n: int, abs_: bool) -> Fact:
    k = rng.randrange(3)
    if k == 0:
        race, other = _two(rng, ["5K", "10K", "half marathon"])
        t1 = rng.randrange(25, 130)
        t2 = t1 - rng.randrange(1, 6)
        return Fact(f"What is my current personal best time for the {other if abs_ else race}?",
                    f"{NOT_ENOUGH} You only mentioned your {race} time." if abs_ else f"{t2} minutes",
                    "health", [("user", f"My personal best time for the {race} is {t1} minutes "
                                        "right now."),
                               ("user", f"Great news, I set a new personal best time for the "
                                        f"{race} today: {t2} minutes!")])
    if k == 1:
        r1 = rng.randrange(900, 2600, 25)
        r2 = r1 + rng.randrange(50, 300, 25)
        what = "parking spot" if abs_ else "apartment"
        return Fact(f"How much is the monthly rent for my {what} now?",
                    f"{NOT_ENOUGH} You only mentioned the rent for your apartment." if abs_
                    else f"${r2}",
                    "finance", [("user", f"The monthly rent for my apartment is ${r1}, "
                                         "which is manageable for now."),
                                ("user", f"My landlord just raised the monthly rent for my "
                                         f"apartment to ${r2}, ugh.")])
    item, other = _two(rng, ["vinyl records", "vintage postcards", "board games", "succulent pots",
                             "comic books"])
    n1 = rng.randrange(10, 60)
    n2 = n1 + rng.randrange(3, 15)
    return Fact(f"How many {other if abs_ else item} are in my collection now?",
                f"{NOT_ENOUGH} You only mentioned your {item} collection." if abs_ else str(n2),
                "hobbies", [("user", f"I counted my collection of {item} and I now have {n1}."),
                            ("user", f"I added a few more {item} to my collection, so now "
                                     f"I have {n2}.")])


_SCHEMAS = dict(zip(QUESTION_TYPES, (_ssu, _ssa, _ssp, _ms, _tr, _ku)))


def make_fact(qtype: str, rng: random.Random, n_evidence: int, abstention: bool) -> Fact:
    """Draw a fact of ``qtype`` with ``n_evidence`` planted sentences."""
    fact = _SCHEMAS[qtype](rng, n_evidence, abstention)
    if len(fact.plants) != n_evidence:  # pragma: no cover - schema authoring error
        raise AssertionError(f"{qtype}: {len(fact.plants)} plants for {n_evidence} sessions")
    return fact
