"""The speaker and time cues over a whole dataset: the research path of
docs/multi-evidence.md (the engine computes the cues from an index's own turn texts and
dates, :mod:`memgas_gpu.retrieve.cues`).  Used by ``multi_evidence.py`` and checked by
``tests/test_cues.py``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from memgas_gpu.data.speakers import named_speakers
from memgas_gpu.retrieve.cues import (SpeakerBM25, SpeakerData, best_turn_scores,
                                      days_since_epoch, message_data, parse_date,
                                      question_interval, speaker_bm25)

__all__ = ["QuestionSpeakers", "build_speaker_data", "speaker_weights", "speaker_signal",
           "time_tensors"]


@dataclass
class QuestionSpeakers(SpeakerData):
    """:class:`SpeakerData` of every conversation, and ``named``: ``[n_questions, P]``
    bool, the speakers each of the index's questions names."""

    named: Tensor = None


def speaker_weights(index, data: QuestionSpeakers, gamma: float = 1.0,
                    granularity: str = "T", k1: float = 1.5, b: float = 0.75,
                    method: str = "lucene", device=None) -> SpeakerBM25:
    """The engine's speaker-weighted BM25 of every conversation over turns (``"T"``) or
    whole sessions (``"S"``), for every speaker slot a question can name."""
    if granularity not in ("T", "S"):
        raise ValueError(f"granularity must be 'T' or 'S', got {granularity!r}")
    return speaker_bm25(index.snapshot(), data, data.named.shape[1], gamma, k1, b, method,
                        device, message_doc=data.msg_turn if granularity == "T"
                        else data.msg_row)


def build_speaker_data(index, dataset) -> QuestionSpeakers:
    """:class:`QuestionSpeakers` of ``index`` (built from ``dataset``, same
    conversations)."""
    view = index.snapshot()
    if view.lexical is None:
        raise ValueError("the speaker cue needs an index built with lexical=True")

    def sessions(ci):
        meta = index.conversations[ci]
        conv = dataset.get(meta.id)
        if conv is None or [s.id for s in conv.sessions] != meta.session_ids:
            raise ValueError(f"dataset {dataset.source!r} does not match the index at "
                             f"conversation {meta.id!r}")
        return [s.turns for s in conv.sessions]

    data = message_data(view, range(index.n_conversations), sessions)
    speakers = data.speakers
    P = max((len(n) for n in speakers), default=0)
    named = torch.zeros(len(index.questions), P, dtype=torch.bool)
    for qi, q in enumerate(index.questions):
        names = speakers[int(index.q_conv[qi])]
        if names:
            named[qi, :len(names)] = torch.tensor(named_speakers(q.text, names))
    return QuestionSpeakers(data.docs, data.msg_row, data.msg_turn, data.msg_speaker,
                            data.speakers, named)


def speaker_signal(index, data: SpeakerData, questions: Tensor,
                   weights: SpeakerBM25) -> Tensor:
    """``[Q, N_max]`` BM25 of each session (best document of the session) with the named
    speaker's messages weighted (BM25F-style, see
    :func:`memgas_gpu.ops.bm25f.field_weighted_counts`).

    A question that names exactly one speaker of its conversation is scored against the
    documents of that speaker's variant; any other question against the plain documents
    (``gamma=0`` or no named speaker: exactly ``bm25_Tmax`` / ``bm25_S``).

    Args:
        index: the memory index (built with ``lexical=True``).
        data: its :class:`SpeakerData`.
        questions: ``[Q]`` indices into ``index.questions``.
        weights: :func:`speaker_bm25` of the same index and data.

    Returns:
        ``[Q, N_max]`` float32 (0 past a conversation's end).
    """
    dev = weights.doc_pos.device
    qi = torch.as_tensor(questions, dtype=torch.long)
    view = index.snapshot()
    conv = index.q_conv[qi]
    offs = view.conv_offsets
    n_max = int((offs[conv + 1] - offs[conv]).max()) if qi.numel() else 0
    out = torch.zeros(qi.numel(), n_max, dtype=torch.float32, device=dev)
    named = data.named[qi]
    variant = torch.where(named.sum(1) == 1, named.float().argmax(1), torch.full_like(qi, -1))
    for v in torch.unique(variant).tolist():
        sel = torch.nonzero(variant == v).squeeze(1)
        out[sel.to(dev)] = best_turn_scores(weights, v, view.lexical.queries.rows(qi[sel]),
                                             conv[sel], n_max)
    return out


def time_tensors(index) -> tuple[Tensor, Tensor, Tensor]:
    """``(start [n_questions], end [n_questions], session_day [n_rows])`` in days (NaN
    where a question has no time expression or a session no readable date)."""
    sess = []
    last_of = []
    for meta in index.conversations:
        ds = [parse_date(d) for d in meta.session_dates]
        sess.extend(days_since_epoch(d) if d else float("nan") for d in ds)
        known = [d for d in ds if d]
        last_of.append(max(known) if known else None)
    start, end = [], []
    for qi, q in enumerate(index.questions):
        iv = question_interval(q.text, anchor=last_of[int(index.q_conv[qi])],
                               question_date=parse_date(q.date))
        start.append(iv[0] if iv else float("nan"))
        end.append(iv[1] if iv else float("nan"))
    f = torch.float64
    return torch.tensor(start, dtype=f), torch.tensor(end, dtype=f), torch.tensor(sess, dtype=f)
