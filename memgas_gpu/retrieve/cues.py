"""Question cues from the data: the speaker a question names, and its time expression.

**Speaker.** Turns are rendered ``[speaker]: text`` (two messages per turn, see
:func:`memgas_gpu.data.model.pair_messages`), so each conversation's speakers are the
names in those brackets: no name list.  A question *names* a speaker when one of its
words is the speaker's first name, or a capitalised prefix of at least three letters
of exactly one speaker's first name ("Mel" for Melanie).  :func:`speaker_signal` is
BM25 over the turns (or sessions) where the named speaker's messages count ``1 + γ``
times (BM25F-style, :func:`memgas_gpu.ops.bm25f.field_weighted_counts`); it replaces
``bm25_Tmax`` (or ``bm25_S``) in the fusion.

**Time.** Absolute expressions in the question ("on 7 July, 2023", "May 23, 2023", "in
August 2023", "in 2022", "in June") become a day interval; a month or day without a
year takes the latest such date not after the anchor (the question's date, else the
conversation's last session).  Relative ones ("last week", "3 days ago", "yesterday",
"last year") need the question's date (LongMemEval has one, LoCoMo does not) and are
skipped without it.  Dates are parsed with ``python-dateutil`` (``dateutil.parser``):
it reads session timestamps of every source here ("1:56 pm on 8 May, 2023",
"2023/05/20 (Sat) 02:21") without a format string, and the spans a regex finds in the
question.  ``dateparser`` / ``parsedatetime`` would add relative phrases, but LoCoMo has
no question date to anchor them, and dateutil is small and already in the environment.
"""
from __future__ import annotations

import calendar
import functools
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..data.speakers import MESSAGE as _MSG, named_speakers, split_messages
from ..ops.bm25 import bm25_scores, bm25_weights
from ..ops.bm25f import field_weighted_counts

__all__ = ["SpeakerData", "message_data", "best_turn_scores", "days_since_epoch",
           "SpeakerBM25", "speaker_bm25", "named_speakers", "split_messages", "parse_date",
           "question_interval", "time_affinity_of", "speaker_data_of", "speaker_turn_signal"]

_EPOCH = date(1970, 1, 1)


@dataclass
class SpeakerData:
    """Messages of every conversation of an index, tokenised, with their speakers.

    Attributes:
        docs: :class:`~memgas_gpu.lexical.TermMatrix` ``[M, V]`` of each message's text
            with its speaker's name (the index's tokenizer and vocabulary), so that the
            messages of a turn add up to the turn's own document.
        msg_row: ``[M]`` index row (conversation session) of each message.
        msg_turn: ``[M]`` turn of each message (a row of ``index.lexical.docs["T"]``).
        msg_speaker: ``[M]`` speaker slot within the conversation (``-1``: none).
        speakers: per conversation, its speaker names (slot order).
        named: ``[n_questions, P]`` bool, the speakers each question names.
    """

    docs: object
    msg_row: Tensor
    msg_turn: Tensor
    msg_speaker: Tensor
    speakers: list
    named: Tensor


def message_data(index, conversations, session_turns) -> SpeakerData:
    """:class:`SpeakerData` of ``conversations`` (``session_turns(c)``: the turn texts of
    each of conversation ``c``'s sessions, in order); ``named`` is left empty
    (``[0, P]``) and ``speakers`` is ``[]`` for the conversations not asked for."""
    from ..lexical import TermMatrix

    lex = index.lexical
    tptr = lex.doc_ptr["T"]
    ids, rows, turns, spk = [], [], [], []
    speakers: list = [[] for _ in range(index.n_conversations)]
    offs = index.conv_offsets.tolist()
    for ci in conversations:
        names: list[str] = []
        for r, session in zip(range(offs[ci], offs[ci + 1]), session_turns(ci)):
            first = int(tptr[int(index.row_slot[r])])
            for ti, t in enumerate(session):
                for who, text in split_messages(t):
                    if who and who not in names:
                        names.append(who)
                    ids.append(lex.vocab.encode(lex.tokenizer.tokens(f"{who} {text}"),
                                                grow=False))
                    rows.append(r)
                    turns.append(first + ti)
                    spk.append(names.index(who) if who else -1)
        speakers[ci] = names
    long = torch.long
    P = max((len(n) for n in speakers), default=0)
    return SpeakerData(TermMatrix.from_ids(ids), torch.tensor(rows, dtype=long),
                       torch.tensor(turns, dtype=long), torch.tensor(spk, dtype=long),
                       speakers, torch.zeros(0, P, dtype=torch.bool))


def best_turn_scores(weights: "SpeakerBM25", variant: int, q_terms, q_conv: Tensor,
                      n_max: int) -> Tensor:
    """``[len(q_conv), n_max]``: each query's best document per session under the
    speaker variant ``variant``'s BM25 weights (0 where no term matches)."""
    dev = weights.doc_pos.device
    W, key = weights.weights[variant]
    qm = q_terms.to(dev)
    S = bm25_scores(W, key, weights.n_terms, qm.indptr, qm.indices, qm.tf, q_conv.to(dev))
    q, d = S.indices()
    out = torch.zeros(q_conv.numel(), n_max, dtype=torch.float32, device=dev)
    out.view(-1).scatter_reduce_(0, q * n_max + weights.doc_pos[d], S.values().float(), "amax")
    return out


@dataclass
class SpeakerBM25:
    """BM25 document weights of every conversation for each speaker variant (built once
    per index and setting by :func:`speaker_bm25`; only scoring runs per question).

    Attributes:
        weights: speaker slot (``-1``: plain documents) → ``(W, col_key)`` of
            :func:`memgas_gpu.ops.bm25.bm25_weights`, conversations as groups.
        doc_pos: ``[n_docs]`` position of each document's session in its conversation.
        n_terms: vocabulary size.
    """

    weights: dict
    doc_pos: Tensor
    n_terms: int


def speaker_bm25(index, data: SpeakerData, gamma: float = 1.0, granularity: str = "T",
                 k1: float = 1.5, b: float = 0.75, method: str = "lucene",
                 device: Optional[str] = None) -> SpeakerBM25:
    """Weighted documents (turns ``"T"`` or sessions ``"S"``) of every conversation, for
    each speaker slot ``p`` (its messages count ``1 + gamma``) and plain (``-1``)."""
    if granularity not in ("T", "S"):
        raise ValueError(f"granularity must be 'T' or 'S', got {granularity!r}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    offs = index.conv_offsets
    unit = data.msg_turn if granularity == "T" else data.msg_row
    units, doc = torch.unique(unit, return_inverse=True)
    first = torch.zeros(units.numel(), dtype=torch.long).scatter_(
        0, doc, torch.arange(doc.numel()))
    doc_row = data.msg_row[first]
    doc_conv = torch.searchsorted(offs, doc_row, right=True) - 1
    m = data.docs
    part = torch.repeat_interleave(torch.arange(m.n_rows), m.indptr[1:] - m.indptr[:-1])
    nnz_doc, spk = doc[part], data.msg_speaker[part]
    V = index.lexical.n_terms
    out = {}
    for v in [-1] + list(range(data.named.shape[1])):
        w = torch.ones(part.numel()) if v < 0 else 1 + gamma * (spk == v).float()
        ip, ix, tf = field_weighted_counts(nnz_doc, m.indices, m.tf, w, units.numel())
        out[v] = bm25_weights(ip.to(dev), ix.to(dev), tf.to(dev), doc_conv.to(dev), V,
                              k1=k1, b=b, method=method)
    return SpeakerBM25(out, (doc_row - offs[doc_conv]).to(dev), V)


# ---------------------------------------------------------------------- time
_MONTHS = "|".join(calendar.month_name[1:]) + "|" + "|".join(
    m for m in calendar.month_abbr[1:] if m != "May")
_DAY = r"(?:\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d\d"
_PATTERNS = [  # (regex, granularity), most specific first
    (rf"\b{_DAY}\s+(?:{_MONTHS})\.?,?\s+{_YEAR}\b", "day"),
    (rf"\b(?:{_MONTHS})\.?\s+{_DAY},?\s+{_YEAR}\b", "day"),
    (rf"\b(?:{_MONTHS})\.?,?\s+{_YEAR}\b", "month"),
    (rf"\b{_DAY}\s+(?:{_MONTHS})\b", "day_noyear"),
    (rf"\b(?:{_MONTHS})\s+{_DAY}\b", "day_noyear"),
    (rf"\b(?:in|during|of|since)\s+{_YEAR}\b", "year"),
    (rf"\b(?:in|during)\s+(?:{_MONTHS})\b", "month_noyear"),
]
#: cheap test first: without a month name or a year no absolute pattern can match
_ANY = re.compile(rf"\b(?:{_MONTHS}|{_YEAR})\b", re.I)
_RELATIVE = [
    (r"\byesterday\b", 1, 1), (r"\blast\s+week(?:end)?\b", 14, 0),
    (r"\blast\s+month\b", 62, 0), (r"\blast\s+year\b", 730, 0),
]
_AGO = re.compile(r"\b(\d+|a|an|one|two|three|four|five|six)\s+(day|week|month|year)s?\s+ago\b",
                  re.I)
_NUM = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_UNIT = {"day": 1, "week": 7, "month": 30, "year": 365}


@functools.lru_cache(maxsize=1 << 16)
def parse_date(text: str) -> Optional[date]:
    """A timestamp string → its date (``None`` when empty or unreadable).  Remembered per
    string: a conversation's dates are read again by every view of it."""
    from dateutil import parser

    if not isinstance(text, str) or not text or not text.strip():
        return None
    try:
        return parser.parse(text, fuzzy=True).date()
    except (ValueError, OverflowError):
        return None


def days_since_epoch(d: date) -> float:
    return float((d - _EPOCH).days)


def question_interval(text: str, anchor: Optional[date] = None,
                      question_date: Optional[date] = None) -> Optional[tuple[float, float]]:
    """``(start, end)`` in days since 1970-01-01 of the question's first time expression,
    or ``None``.  ``anchor`` resolves year-less dates; ``question_date`` also enables
    relative expressions (it is the anchor when given)."""
    from dateutil import parser

    anchor = question_date or anchor
    if question_date is None and not _ANY.search(text):
        return None
    for pat, gran in _PATTERNS:
        m = re.search(pat, text, re.I if gran not in ("month_noyear",) else 0)
        if not m:
            continue
        span = re.sub(r"^(in|during|of|since)\s+", "", m.group(0), flags=re.I)
        span = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", span)
        if gran == "year":
            y = int(span)
            return days_since_epoch(date(y, 1, 1)), days_since_epoch(date(y, 12, 31))
        if gran.endswith("noyear") and anchor is None:
            continue
        ref = datetime(anchor.year if anchor else 2000, 1, 1)
        try:
            d = parser.parse(span, default=ref).date()
        except (ValueError, OverflowError):
            continue
        if gran.endswith("noyear") and d > anchor:
            try:  # year 1 has no year before it; 29 February may not exist in it
                d = d.replace(year=d.year - 1)
            except ValueError:
                continue
        if gran.startswith("month"):
            last = calendar.monthrange(d.year, d.month)[1]
            return days_since_epoch(d.replace(day=1)), days_since_epoch(d.replace(day=last))
        return days_since_epoch(d), days_since_epoch(d)
    if question_date is None:
        return None
    q = question_date
    try:  # OverflowError: an interval before year 1 or after 9999
        for pat, back, fwd in _RELATIVE:
            if re.search(pat, text, re.I):
                return days_since_epoch(q - timedelta(days=back)), days_since_epoch(q - timedelta(days=fwd))
        m = _AGO.search(text)
        if m:
            g = m.group(1).lower()
            n = int(g) if g.isdigit() else _NUM[g]
            back = n * _UNIT[m.group(2).lower()]
            slack = max(2, back // 4)
            return (days_since_epoch(q - timedelta(days=back + slack)),
                    days_since_epoch(q - timedelta(days=back - slack)))
    except OverflowError:
        return None
    return None


def _cached(view, name: str, build):
    """``build()``, kept in the view's derived-data cache (one home for derived data:
    :mod:`memgas_gpu.retrieve.cache`)."""
    got = view.cache.get(name)
    if got is None:
        got = view.cache[name] = build()
    return got


def _session_days(index) -> list:
    """Per conversation: its session dates in days (NaN: unreadable) and its latest date."""
    def build():
        out = []
        for meta in index.conversations:
            ds = [parse_date(d) for d in meta.session_dates]
            known = [d for d in ds if d]
            out.append(([days_since_epoch(d) if d else float("nan") for d in ds],
                        max(known) if known else None))
        return out

    return _cached(index, "cue_days", build)


def time_affinity_of(index, texts: Sequence[str], dates, layout) -> Tensor:
    """``[Q, N_max]`` time cue of queries ``texts`` (asked on ``dates``, entries may be
    None) laid out as ``layout`` (:class:`~memgas_gpu.retrieve.signals.Layout`): 1 where
    the session's date is inside the query's interval, else 0."""
    from ..ops.time_affinity import time_affinity

    days = _session_days(index)
    conv = layout.conv.tolist()
    start, end = [], []
    for j, text in enumerate(texts):
        qd = parse_date(dates[j]) if dates is not None and dates[j] else None
        iv = question_interval(text, anchor=days[conv[j]][1], question_date=qd)
        start.append(iv[0] if iv else float("nan"))
        end.append(iv[1] if iv else float("nan"))
    N = layout.n_max
    sd = torch.full((len(texts), N), float("nan"), dtype=torch.float64)
    for j, c in enumerate(conv):
        d = days[c][0]
        sd[j, :len(d)] = torch.tensor(d, dtype=torch.float64)
    f = torch.float64
    return time_affinity(torch.tensor(start, dtype=f), torch.tensor(end, dtype=f), sd,
                         layout.valid)


def speaker_data_of(index, conversations: Sequence[int]) -> SpeakerData:
    """:class:`SpeakerData` of some conversations of ``index``, read from its stored turn
    texts (no dataset needed); ``speakers[c]`` is ``[]`` for the conversations not
    asked for."""
    if index.lexical is None or index.turn_text is None:
        raise ValueError("the speaker cue needs an index built with lexical=True and "
                         "keep_text=True (it reads the turns' speakers)")
    ptr = index.turn_ptr.tolist()
    offs = index.conv_offsets.tolist()

    def sessions(ci):
        slots = index.row_slot[offs[ci]:offs[ci + 1]].tolist()
        return [index.turn_text.strings(range(ptr[j], ptr[j + 1])) for j in slots]

    return message_data(index, conversations, sessions)


def speaker_turn_signal(index, texts: Sequence[str], q_conv: Tensor, q_terms, layout,
                        gamma: float, k1: float = 1.5, b: float = 0.75,
                        method: str = "lucene", device: Optional[str] = None) -> Tensor:
    """``bm25_Tmax`` with the speaker cue, for queries given as texts and term counts:
    a query that names exactly one speaker of its conversation scores the turns with
    that speaker's messages counted ``1 + gamma`` times; other queries get exactly
    ``bm25_Tmax``.  Only the conversations of queries naming a speaker are re-weighted.

    Returns:
        ``[Q, layout.n_max]`` float32 (0 past a conversation's end).
    """
    from ..lexical import BM25Params, lexical_signals

    dev = torch.device(device or "cpu")
    out = lexical_signals(index, q_terms, q_conv, {"bm25_Tmax": ("T", "max")},
                          params=BM25Params(k1, b, method), device=str(dev))["bm25_Tmax"]
    conv = q_conv.to(torch.long).cpu()
    cand = sorted(set(conv.tolist()))
    if not cand or gamma <= 0:
        return out
    speakers = _speakers(index, cand)
    variant = torch.full((len(texts),), -1, dtype=torch.long)
    for j, t in enumerate(texts):
        hit = named_speakers(t, speakers[int(conv[j])]) if speakers[int(conv[j])] else []
        if sum(hit) == 1:
            variant[j] = hit.index(True)
    pick = sorted({int(conv[j]) for j in torch.nonzero(variant >= 0).squeeze(1).tolist()})
    if not pick:
        return out
    w = _speaker_weights(index, pick, max(len(speakers[c]) for c in pick), gamma, k1, b,
                         method, dev)
    for v in torch.unique(variant[variant >= 0]).tolist():
        sel = torch.nonzero(variant == v).squeeze(1)
        out[sel.to(dev)] = best_turn_scores(w, v, q_terms.rows(sel), conv[sel],
                                             layout.n_max)
    return out


def _speaker_weights(index, pick: Sequence[int], n_speakers: int, gamma: float, k1: float,
                     b: float, method: str, dev: torch.device) -> SpeakerBM25:
    """:func:`speaker_bm25` of the turns of conversations ``pick`` for speaker slots
    ``0..n_speakers-1`` (more if their messages name more), kept with the index view per
    conversations and setting, so a later question naming a speaker only scores. Every
    slot is built at once: which speaker a later question names is not known yet."""
    got = _cached(index, "cue_speaker_bm25", dict)
    key = (tuple(pick), float(gamma), float(k1), float(b), method, str(dev))
    w = got.get(key)
    if w is None:
        data = speaker_data_of(index, pick)
        n = max([n_speakers] + [len(data.speakers[c]) for c in pick])
        data.named = torch.zeros(0, n, dtype=torch.bool)
        w = speaker_bm25(index, data, gamma, "T", k1, b, method, str(dev))
        if len(got) >= 64:  # many different batches over one view: start again
            got.clear()
        got[key] = w
    return w


def _speakers(index, conversations: Sequence[int]) -> list:
    """Speaker names per conversation index (from the ``[name]:`` prefixes of its turns),
    cached with the index view."""
    got = _cached(index, "cue_speakers", dict)
    offs = index.conv_offsets.tolist()
    for ci in conversations:
        if ci in got:
            continue
        names: list = []
        for r in range(offs[ci], offs[ci + 1]):
            slot = int(index.row_slot[r])
            for t in range(int(index.turn_ptr[slot]), int(index.turn_ptr[slot + 1])):
                for m in _MSG.finditer(index.turn_text[t]):
                    who = m.group(1).strip()
                    if who and who not in names:
                        names.append(who)
        got[ci] = names
    return [got.get(c, []) for c in range(index.n_conversations)]
