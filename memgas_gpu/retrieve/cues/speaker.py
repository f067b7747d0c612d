"""The speaker cue: BM25 over a conversation's turns where the speaker a question names
counts more.

Turns are rendered ``[speaker]: text`` (two messages per turn, see
:func:`memgas_gpu.data.model.pair_messages`), so each conversation's speakers are the
names in those brackets: no name list.  A question *names* a speaker when one of its
words is the speaker's first name, or a capitalised prefix of at least three letters
of exactly one speaker's first name ("Mel" for Melanie).  For such a question the
``bm25_Tmax`` signal scores the turns with that speaker's messages counted
``1 + speaker_gamma`` times (BM25F-style,
:func:`memgas_gpu.ops.bm25f.field_weighted_counts`); any other question gets plain
``bm25_Tmax``.  :func:`speaker_turn_bm25` is that signal's compute function in the
signal registry (:mod:`memgas_gpu.retrieve.signals`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ...data.speakers import MESSAGE as _MSG, named_speakers, split_messages
from ...ops.bm25 import bm25_scores, bm25_weights
from ...ops.bm25f import field_weighted_counts

__all__ = ["SpeakerData", "message_data", "best_turn_scores", "SpeakerBM25", "speaker_bm25",
           "speaker_data_of", "speaker_turn_signal", "speaker_turn_bm25", "named_speakers",
           "split_messages"]


@dataclass
class SpeakerData:
    """Messages of some conversations of a view, tokenised, with their speakers.

    Attributes:
        docs: :class:`~memgas_gpu.lexical.TermMatrix` ``[M, V]`` of each message's text
            with its speaker's name (the view's tokenizer and vocabulary), so that the
            messages of a turn add up to the turn's own document.
        msg_row: ``[M]`` view row (conversation session) of each message.
        msg_turn: ``[M]`` turn of each message (a row of ``view.lexical.docs["T"]``).
        msg_speaker: ``[M]`` speaker slot within the conversation (``-1``: none).
        speakers: per conversation, its speaker names (slot order).
    """

    docs: object
    msg_row: Tensor
    msg_turn: Tensor
    msg_speaker: Tensor
    speakers: list


def message_data(view, conversations, session_turns) -> SpeakerData:
    """:class:`SpeakerData` of ``conversations`` (positions in ``view``;
    ``session_turns(c)``: the turn texts of each of conversation ``c``'s sessions, in
    order); ``speakers`` is ``[]`` for the conversations not asked for."""
    from ...lexical import TermMatrix

    lex = view.lexical
    tptr = lex.doc_ptr["T"]
    ids, rows, turns, spk = [], [], [], []
    speakers: list = [[] for _ in range(view.n_conversations)]
    offs = view.conv_offsets.tolist()
    for ci in conversations:
        names: list[str] = []
        for r, session in zip(range(offs[ci], offs[ci + 1]), session_turns(ci)):
            first = int(tptr[int(view.row_slot[r])])
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
    return SpeakerData(TermMatrix.from_ids(ids), torch.tensor(rows, dtype=long),
                       torch.tensor(turns, dtype=long), torch.tensor(spk, dtype=long),
                       speakers)


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


def speaker_bm25(view, data: SpeakerData, n_speakers: int, gamma: float = 1.0,
                 k1: float = 1.5, b: float = 0.75, method: str = "lucene",
                 device: Optional[str] = None,
                 message_doc: Optional[Tensor] = None) -> SpeakerBM25:
    """Weighted documents of every conversation of ``data``, for each speaker slot
    ``0..n_speakers-1`` (its messages count ``1 + gamma``) and plain (``-1``).

    Args:
        message_doc: ``[M]`` the document each message belongs to (default: its turn,
            ``data.msg_turn``; ``data.msg_row`` makes one document per session).
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    offs = view.conv_offsets
    unit = data.msg_turn if message_doc is None else message_doc
    units, doc = torch.unique(unit, return_inverse=True)
    first = torch.zeros(units.numel(), dtype=torch.long).scatter_(
        0, doc, torch.arange(doc.numel()))
    doc_row = data.msg_row[first]
    doc_conv = torch.searchsorted(offs, doc_row, right=True) - 1
    m = data.docs
    part = torch.repeat_interleave(torch.arange(m.n_rows), m.indptr[1:] - m.indptr[:-1])
    nnz_doc, spk = doc[part], data.msg_speaker[part]
    V = view.lexical.n_terms
    out = {}
    for v in [-1] + list(range(n_speakers)):
        w = torch.ones(part.numel()) if v < 0 else 1 + gamma * (spk == v).float()
        ip, ix, tf = field_weighted_counts(nnz_doc, m.indices, m.tf, w, units.numel())
        out[v] = bm25_weights(ip.to(dev), ix.to(dev), tf.to(dev), doc_conv.to(dev), V,
                              k1=k1, b=b, method=method)
    return SpeakerBM25(out, (doc_row - offs[doc_conv]).to(dev), V)


def speaker_data_of(view, conversations: Sequence[int]) -> SpeakerData:
    """:class:`SpeakerData` of some conversations of ``view``, read from its stored turn
    texts (no dataset needed); ``speakers[c]`` is ``[]`` for the conversations not
    asked for."""
    if view.lexical is None or view.turn_text is None:
        raise ValueError("the speaker cue needs an index built with lexical=True and "
                         "keep_text=True (it reads the turns' speakers)")
    ptr = view.turn_ptr.tolist()
    offs = view.conv_offsets.tolist()

    def sessions(ci):
        slots = view.row_slot[offs[ci]:offs[ci + 1]].tolist()
        return [view.turn_text.strings(range(ptr[j], ptr[j + 1])) for j in slots]

    return message_data(view, conversations, sessions)


def speaker_turn_signal(view, texts: Sequence[str], q_conv: Tensor, q_terms, layout,
                        gamma: float, k1: float = 1.5, b: float = 0.75,
                        method: str = "lucene", device: Optional[str] = None, *,
                        spec: dict) -> Tensor:
    """``bm25_Tmax`` with the speaker cue, for queries given as texts and term counts:
    a query that names exactly one speaker of its conversation scores the turns with
    that speaker's messages counted ``1 + gamma`` times; other queries get exactly
    ``bm25_Tmax`` (``spec``: its ``{"bm25_Tmax": (docs, reduce)}`` in the signal
    registry).  Only the conversations of queries naming a speaker are re-weighted.

    Returns:
        ``[Q, layout.n_max]`` float32 (0 past a conversation's end).
    """
    from ...lexical import BM25Params, lexical_signals

    dev = torch.device(device or "cpu")
    out = lexical_signals(view, q_terms, q_conv, spec, params=BM25Params(k1, b, method),
                          device=str(dev), postings=view.postings)["bm25_Tmax"]
    conv = q_conv.to(torch.long).cpu()
    cand = sorted(set(conv.tolist()))
    if not cand or gamma <= 0:
        return out
    speakers = _speakers(view, cand)
    variant = torch.full((len(texts),), -1, dtype=torch.long)
    for j, t in enumerate(texts):
        hit = named_speakers(t, speakers[int(conv[j])]) if speakers[int(conv[j])] else []
        if sum(hit) == 1:
            variant[j] = hit.index(True)
    pick = sorted({int(conv[j]) for j in torch.nonzero(variant >= 0).squeeze(1).tolist()})
    if not pick:
        return out
    w = _speaker_weights(view, pick, max(len(speakers[c]) for c in pick), gamma, k1, b,
                         method, dev)
    for v in torch.unique(variant[variant >= 0]).tolist():
        sel = torch.nonzero(variant == v).squeeze(1)
        out[sel.to(dev)] = best_turn_scores(w, v, q_terms.rows(sel), conv[sel],
                                             layout.n_max)
    return out


def speaker_turn_bm25(ctx, names: Sequence[str]) -> dict:
    """The registry's ``bm25_Tmax``: best turn by BM25, with the speaker cue of
    ``ctx.params.speaker_gamma`` (plain BM25 when it is 0, without query texts, or with
    another lexical index such as the sweep's tokenizer grid)."""
    from ...lexical import BM25Params, lexical_signals

    p, batch = ctx.params, ctx.batch
    if p.speaker_gamma <= 0 or batch.q_text is None or ctx.lexical is not None:
        return lexical_signals(ctx.view, batch.q_terms, batch.q_conv,
                               ctx.lexical_specs(names),
                               params=BM25Params(p.k1, p.b, p.bm25_method),
                               device=str(ctx.device), lexical=ctx.lexical,
                               postings=ctx.view.postings)
    return {"bm25_Tmax": speaker_turn_signal(ctx.view, batch.q_text, batch.q_conv,
                                             batch.q_terms, ctx.layout, p.speaker_gamma,
                                             p.k1, p.b, p.bm25_method, str(ctx.device),
                                             spec=ctx.lexical_specs(["bm25_Tmax"]))}


def _speaker_weights(view, pick: Sequence[int], n_speakers: int, gamma: float, k1: float,
                     b: float, method: str, dev: torch.device) -> SpeakerBM25:
    """:func:`speaker_bm25` of the turns of conversations ``pick`` for speaker slots
    ``0..n_speakers-1`` (more if their messages name more), kept with the view per
    conversations and setting, so a later question naming a speaker only scores. Every
    slot is built at once: which speaker a later question names is not known yet."""
    got = view.derived("cue_speaker_bm25", dict)
    key = (tuple(pick), float(gamma), float(k1), float(b), method, str(dev))
    w = got.get(key)
    if w is None:
        data = speaker_data_of(view, pick)
        n = max([n_speakers] + [len(data.speakers[c]) for c in pick])
        w = speaker_bm25(view, data, n, gamma, k1, b, method, str(dev))
        if len(got) >= 64:  # many different batches over one view: start again
            got.clear()
        got[key] = w
    return w


def _speakers(view, conversations: Sequence[int]) -> list:
    """Speaker names per conversation of the view (from the ``[name]:`` prefixes of its
    turns), kept with each conversation's segment."""
    out: list = [[] for _ in range(view.n_conversations)]
    offs = view.conv_offsets.tolist()
    for ci in conversations:
        def build(ci=ci):
            names: list = []
            for r in range(offs[ci], offs[ci + 1]):
                slot = int(view.row_slot[r])
                t0, t1 = int(view.turn_ptr[slot]), int(view.turn_ptr[slot + 1])
                for text in view.turn_text.strings(range(t0, t1)):
                    for m in _MSG.finditer(text):
                        who = m.group(1).strip()
                        if who and who not in names:
                            names.append(who)
            return names

        out[ci] = view.per_conversation(ci, "speakers", build)
    return out
