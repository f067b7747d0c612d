"""Consolidation (buffer → topic node) and the Topic Associative Network (TAN).

A topic is a run of consecutive events (``event_ptr[k]:event_ptr[k+1]``) with two
representations: ``c_raw`` (the events' texts joined; embedding: the normalised mean of
the event embeddings) and ``c_sum`` (a summary from a summary source; embedding: the
encoder's). Its *key* for candidate search is ``normalise(c_sum + c_raw)``.

Linking (coarse-to-fine): each new topic takes the ``m`` most similar earlier topics of
its conversation; by default the MemGAS 2-component GMM (:func:`~memgas_gpu.ops.gmm1d_accept`)
splits them into a high and a low component, and the ``candidates`` (5) best are linked
when they fall in the high component with confidence ``>= conf_min``. The confidence is
the posterior of the high component under the two Gaussians re-estimated from that
split (:func:`high_posterior`). Relation type: ``"semantic"`` (a similarity test cannot
type a relation); the optional LLM judge (:mod:`memgas_gpu.gam.judge`) types it.

All dot products are elementwise products summed over the last dimension (the same
reduction, hence the same bits, for one online row and a batched offline block).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ..ops import gmm1d_accept
from ..ops.topm import range_top_m

__all__ = ["Topics", "raw_embeddings", "topic_keys", "summarize", "candidate_rows",
           "high_posterior", "accept_links", "RELATIONS"]

#: relation types of the paper; only the similarity test's "semantic" is used offline
RELATIONS = ("support", "contradict", "coreference", "causal", "semantic", "unrelated")


@dataclass
class Topics:
    """Topic nodes of many conversations and the TAN edges.

    Attributes:
        event_ptr: ``[T+1]`` topic ``k`` owns events ``event_ptr[k]:event_ptr[k+1]``
            (the cross-layer links E_cross; the archived events are the event table).
        conv: ``[T]`` conversation position.
        raw_emb, sum_emb, key: ``[T, d]`` c_raw, c_sum and search-key embeddings.
        summaries: c_sum texts.
        src, dst: ``[L]`` edges (new topic → earlier topic; undirected in use).
        conf: ``[L]`` confidence of each edge; ``relation``: its type.
    """

    event_ptr: Tensor
    conv: Tensor
    raw_emb: Tensor
    sum_emb: Tensor
    key: Tensor
    summaries: list[str]
    src: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    dst: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    conf: Tensor = field(default_factory=lambda: torch.zeros(0))
    relation: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.conv.numel()

    @property
    def event_topic(self) -> Tensor:
        """``[E]`` topic of each event."""
        counts = self.event_ptr[1:] - self.event_ptr[:-1]
        return torch.repeat_interleave(torch.arange(counts.numel()), counts)


def raw_embeddings(emb: Tensor, event_ptr: Tensor) -> Tensor:
    """c_raw embeddings: normalised sum of each topic's event embeddings.

    The events are added in order, one position of every topic at a time (a loop over
    the longest topic's length, not per event), so the online writer, calling this with
    one topic, gets the same bits."""
    start = event_ptr[:-1]
    n = event_ptr[1:] - start
    T, L = n.numel(), int(n.max()) if n.numel() else 0
    pos = torch.arange(L)
    live = pos[None, :] < n[:, None]
    rows = torch.where(live, start[:, None] + pos[None, :], torch.zeros_like(live, dtype=torch.long))
    X = emb[rows] * live[..., None].to(emb.dtype)  # [T, L, d], zeros past each topic's end
    acc = torch.zeros(T, emb.shape[1], dtype=emb.dtype)
    for p in range(L):  # x + 0.0 == x: the padding never changes a sum
        acc += X[:, p]
    return torch.nn.functional.normalize(acc, dim=-1)


def topic_keys(raw_emb: Tensor, sum_emb: Tensor) -> Tensor:
    """Search keys ``normalise(c_sum + c_raw)``."""
    return torch.nn.functional.normalize(raw_emb + sum_emb, dim=-1)


def summarize(raw_texts: Sequence[str], source: Any = "offline",
              conversations: Optional[Sequence] = None) -> list[str]:
    """c_sum of each topic.

    ``"offline"`` (default): the extractive summariser of :mod:`memgas_gpu.expand`, run
    on each topic alone (its term weights come from the topic itself, so a summary
    never depends on later topics and the online writer gets the same text). ``"raw"``:
    c_sum = c_raw. Any summary source object (:func:`memgas_gpu.expand.resolve_source`,
    e.g. the LLM stage) gets the topics as pseudo-sessions in one call.
    """
    if source == "raw":
        return list(raw_texts)
    if source == "offline":
        from ..expand.offline import OfflineExtractor

        ex = OfflineExtractor()
        return [ex.summaries([t])[0] if t else "" for t in raw_texts]
    from ..data.model import Conversation, Session
    from ..expand.sources import resolve_source

    src = resolve_source(source)
    sessions = [Session(f"topic_{k}", "", tuple(t.split("\n"))) for k, t in enumerate(raw_texts)]
    convs = conversations or [Conversation("gam", [])] * len(sessions)
    return src.generate("summary", sessions, convs)


def candidate_rows(key: Tensor, conv: Tensor, rows: Tensor, m: int,
                   chunk: int = 1 << 22) -> tuple[Tensor, Tensor, Tensor]:
    """The ``m`` most similar earlier topics (same conversation) of each topic in ``rows``.

    Earlier topics of the same conversation are the contiguous range ``[first, row)``;
    the search is :func:`~memgas_gpu.ops.range_top_m` (exact mode: one row searched
    online gets the bits of the batched build).

    Returns ``(sims [R, m], index [R, m], valid [R, m])`` sorted by similarity (ties: the
    earlier topic first); invalid slots have index 0 and similarity ``-inf``.
    """
    first = torch.searchsorted(conv.contiguous(), conv[rows].contiguous(), right=False)
    return range_top_m(key[rows], key, first, rows, m, exact=True, max_elements=chunk)


def high_posterior(sims: Tensor, valid: Tensor, accept: Tensor) -> Tensor:
    """Posterior of the high component for every candidate, with the two Gaussians
    (weight, mean, variance) re-estimated from the accept/reject split of each row.
    A row with an empty side gets confidence 1 on the accepted side, 0 elsewhere."""
    x = torch.where(valid, sims, torch.zeros_like(sims)).double()
    hi = (accept & valid).double()
    lo = (~accept & valid).double()
    n1, n0 = hi.sum(1, keepdim=True), lo.sum(1, keepdim=True)
    n = (n1 + n0).clamp_min(1)
    mu1 = (x * hi).sum(1, keepdim=True) / n1.clamp_min(1)
    mu0 = (x * lo).sum(1, keepdim=True) / n0.clamp_min(1)
    v1 = ((x - mu1) ** 2 * hi).sum(1, keepdim=True) / n1.clamp_min(1) + 1e-6
    v0 = ((x - mu0) ** 2 * lo).sum(1, keepdim=True) / n0.clamp_min(1) + 1e-6
    l1 = torch.log(n1 / n) - 0.5 * (torch.log(v1) + (x - mu1) ** 2 / v1)
    l0 = torch.log(n0.clamp_min(1e-300) / n) - 0.5 * (torch.log(v0) + (x - mu0) ** 2 / v0)
    post = torch.sigmoid(l1 - l0)
    post = torch.where((n1 > 0) & (n0 > 0), post, hi)
    return torch.where(valid, post, torch.zeros_like(post)).float()


def accept_links(sims: Tensor, index: Tensor, valid: Tensor, rows: Tensor, *,
                 candidates: int = 5, conf_min: float = 0.5, min_earlier: int = 3,
                 judge: Optional[Callable] = None, texts: Optional[Sequence[str]] = None
                 ) -> tuple[Tensor, Tensor, Tensor, list[str]]:
    """TAN edges of ``rows`` from their candidate rows (:func:`candidate_rows`).

    Args:
        judge: optional ``judge(pairs) -> [(relation, confidence)]`` for ``pairs`` of
            ``(new topic text, earlier topic text)`` from ``texts`` (indexed like
            ``rows``/``index``): the LLM path (:mod:`memgas_gpu.gam.judge`); default: the
            GMM test.
        candidates: how many of the best candidates may be linked (5 in the paper).
        conf_min: confidence threshold of an edge.
        min_earlier: rows with fewer earlier topics get no edges (the GMM needs a few
            points; MemGAS skips its first sessions likewise).

    Returns:
        ``(src, dst, conf, relation)``.
    """
    n_valid = valid.sum(1)
    top = torch.zeros_like(valid)
    top[:, :candidates] = True
    top &= valid & (n_valid >= min_earlier)[:, None]
    if judge is None:
        acc = gmm1d_accept(sims, valid)
        conf = high_posterior(sims, valid, acc)
        keep = top & acc & (conf >= conf_min)
        r, c = torch.nonzero(keep, as_tuple=True)
        return rows[r], index[r, c], conf[r, c], ["semantic"] * r.numel()
    r, c = torch.nonzero(top, as_tuple=True)
    verdicts = judge([(texts[a], texts[b])
                      for a, b in zip(rows[r].tolist(), index[r, c].tolist())])
    rel = [v[0] for v in verdicts]
    conf = torch.tensor([float(v[1]) for v in verdicts], dtype=torch.float32)
    keep = torch.tensor([x != "unrelated" for x in rel], dtype=torch.bool) & (conf >= conf_min)
    kept = torch.nonzero(keep).flatten().tolist()
    return rows[r][keep], index[r, c][keep], conf[keep], [rel[i] for i in kept]
