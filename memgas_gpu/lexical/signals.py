"""Lexical session signals of a :class:`~memgas_gpu.retrieve.MemoryIndex`: BM25 of every
question against the sessions of its own conversation, per granularity.

=============  ==========================================================================
signal         score of session i for question q
=============  ==========================================================================
``bm25_S``     BM25 of q against session i's text; corpus = the conversation's sessions
``bm25_Tmax``  max over session i's turns of BM25(q, turn); corpus = the conversation's turns
``bm25_Tmean`` mean over session i's turns of the same turn scores
``bm25_U``     BM25 against session i's summary; corpus = the conversation's summaries
``bm25_K``     BM25 against session i's keywords; corpus = the conversation's keyword lists
=============  ==========================================================================

What does not depend on the question is computed once per (granularity, BM25 setting,
device) and cached on the lexical index (``LexicalIndex.score_cache``): the posting
lists of every (conversation, term) with their ``idf · tfc`` weights under that
conversation's statistics, as ``bm25s`` stores per index. Scoring all questions is then
one key lookup, one gather of the touched postings and one scatter per signal
(:func:`memgas_gpu.ops.bm25.bm25_gather`). A memory index gives every view of its
conversations its own lexical index (:mod:`memgas_gpu.memory.segments`), so the
postings of one conversation are built once per version of it; the cache also
rebuilds itself when the layout it was built for changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..ops.bm25 import BM25Postings, bm25_gather, bm25_postings

__all__ = ["BM25Params", "GranularityPostings", "Rows", "lexical_signals", "lexical_postings",
           "join_postings"]


@dataclass
class BM25Params:
    """BM25 settings (defaults as ``bm25s``)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"


@dataclass
class GranularityPostings:
    """Cached BM25 postings of one granularity over every conversation of an index.

    Attributes:
        post: postings; keys ``conversation * n_terms + term``, ``doc`` indexes the
            documents of this granularity enumerated conversation by conversation,
            session by session (one per session for S, U, K; one per turn for T).
        doc_session: ``[n_docs]`` session position (within its conversation) of each doc.
        doc_weight: ``[n_docs]`` 1 / (documents of the doc's session), for ``"mean"``.
        conv_offsets, row_slot: the index layout it was built for (checked on use).
    """

    post: BM25Postings
    doc_session: Tensor
    doc_weight: Tensor
    conv_offsets: Tensor
    row_slot: Tensor

    def matches(self, index) -> bool:
        return (torch.equal(self.conv_offsets, index.conv_offsets)
                and torch.equal(self.row_slot, index.row_slot))


def _chunks(index, lex, max_nnz: int) -> list:
    """Conversation ranges ``[c0, c1)`` of at most ``max_nnz`` S-document terms each."""
    offs = index.conv_offsets
    s_nnz = lex.docs["S"].indptr[1:] - lex.docs["S"].indptr[:-1]
    row_cost = torch.cat([torch.zeros(1, dtype=torch.int64),
                          s_nnz[index.row_slot].cumsum(0)])
    cost = (row_cost[offs[1:]] - row_cost[offs[:-1]]).tolist()
    out, start = [], 0
    while start < len(cost):
        end, acc = start, 0
        while end < len(cost) and (end == start or acc + cost[end] <= max_nnz):
            acc += cost[end]
            end += 1
        out.append((start, end))
        start = end
    return out


@dataclass
class Rows:
    """Some conversations of a lexical index: what :func:`lexical_postings` reads (a
    view of a memory has the same three attributes)."""

    lexical: object
    conv_offsets: Tensor
    row_slot: Tensor


def join_postings(parts: Sequence[GranularityPostings], conv_offsets: Tensor,
                  row_slot: Tensor, n_terms: int) -> GranularityPostings:
    """The postings of consecutive conversations, each of ``parts`` the postings of one
    of them alone (one group): keys re-grouped, documents renumbered, no BM25 statistic
    computed again (each conversation is its own corpus)."""
    dev = parts[0].post.score.device if parts else torch.device("cpu")
    keys, ptrs, docs, scores, sess, weights = [], [torch.zeros(1, dtype=torch.int64,
                                                                device=dev)], [], [], [], []
    n_docs, end = 0, ptrs[0][-1]
    for c, gp in enumerate(parts):
        post = gp.post
        keys.append(post.col_key % post.n_terms + c * n_terms)
        ptrs.append(post.col_ptr[1:] + end)
        if ptrs[-1].numel():  # a conversation without sessions has no keys
            end = ptrs[-1][-1]
        docs.append(post.doc + n_docs)
        scores.append(post.score)
        sess.append(gp.doc_session)
        weights.append(gp.doc_weight)
        n_docs += int(gp.doc_session.numel())
    if not parts:
        e = torch.zeros(0, dtype=torch.int64, device=dev)
        return GranularityPostings(BM25Postings(e, ptrs[0], e, torch.zeros(0, device=dev),
                                                n_terms), e, torch.zeros(0, device=dev),
                                   conv_offsets.clone(), row_slot.clone())
    return GranularityPostings(
        BM25Postings(torch.cat(keys), torch.cat(ptrs), torch.cat(docs), torch.cat(scores),
                     n_terms), torch.cat(sess), torch.cat(weights), conv_offsets.clone(),
        row_slot.clone())


def lexical_postings(index, granularity: str, params: Optional[BM25Params] = None,
                     device=None, max_nnz: int = 1 << 24,
                     lexical=None, cache: bool = True) -> GranularityPostings:
    """The cached :class:`GranularityPostings` of ``index`` (built on first use).

    Args:
        index: the conversations (a view of a memory, or :class:`Rows`) with lexical
            data.
        granularity: ``"S"``, ``"T"``, ``"U"`` or ``"K"``.
        params: :class:`BM25Params`.
        device: where the postings live (default CPU).
        max_nnz: document terms per conversation chunk while building.
        lexical: the LexicalIndex to use (default ``index.lexical``).
        cache: keep the postings in ``lexical.score_cache`` (and read them from there).
    """
    lex = lexical if lexical is not None else index.lexical
    p = params or BM25Params()
    dev = torch.device(device or "cpu")
    key = (granularity, float(p.k1), float(p.b), p.method, str(dev))
    got = lex.score_cache.get(key) if cache else None
    if got is not None and got.matches(index):
        return got
    V = lex.n_terms
    offs = index.conv_offsets
    ptr = lex.doc_ptr[granularity]
    parts, n_docs = [], 0
    for c0, c1 in _chunks(index, lex, max_nnz):
        rows = torch.arange(int(offs[c0]), int(offs[c1]))
        row_conv = torch.repeat_interleave(torch.arange(c0, c1),
                                           offs[c0 + 1:c1 + 1] - offs[c0:c1])
        row_pos = rows - offs[row_conv]
        slots = index.row_slot[rows]
        cnt = ptr[slots + 1] - ptr[slots]
        doc_row = torch.repeat_interleave(torch.arange(rows.numel()), cnt)
        first = torch.cumsum(cnt, 0) - cnt
        doc_ids = ptr[slots][doc_row] + torch.arange(doc_row.numel()) - first[doc_row]
        docs = lex.docs[granularity].rows(doc_ids).to(dev)
        post = bm25_postings(docs.indptr, docs.indices, docs.tf, row_conv[doc_row].to(dev), V,
                             k1=p.k1, b=p.b, method=p.method)
        weight = 1.0 / cnt[doc_row].clamp_min(1).float()
        parts.append((post, row_pos[doc_row], weight, n_docs))
        n_docs += doc_row.numel()
    if parts:
        col_ptr = [parts[0][0].col_ptr[:1]]
        for post, _, _, _ in parts:
            col_ptr.append(post.col_ptr[1:] + col_ptr[-1][-1])
        post = BM25Postings(torch.cat([x[0].col_key for x in parts]), torch.cat(col_ptr),
                            torch.cat([x[0].doc + x[3] for x in parts]),
                            torch.cat([x[0].score for x in parts]), V)
        doc_session = torch.cat([x[1] for x in parts]).to(dev)
        doc_weight = torch.cat([x[2] for x in parts]).to(dev)
    else:
        e = torch.zeros(0, dtype=torch.int64, device=dev)
        post = BM25Postings(e, torch.zeros(1, dtype=torch.int64, device=dev), e,
                            torch.zeros(0, device=dev), V)
        doc_session, doc_weight = e, torch.zeros(0, device=dev)
    got = GranularityPostings(post, doc_session, doc_weight, offs.clone(),
                              index.row_slot.clone())
    if cache:
        lex.score_cache[key] = got
    return got


def lexical_signals(view, queries, query_conversation: Tensor, specs: dict,
                    params: Optional[BM25Params] = None, device: Optional[str] = None,
                    max_nnz: int = 1 << 24, lexical=None, postings=None) -> dict:
    """BM25 signals ``{name: [Q, N_max] float32}`` (0 where no term matches; padding
    past a conversation's end is 0 too: mask it with the session counts).

    Args:
        view: the conversations (a :class:`~memgas_gpu.memory.segments.View` built
            with lexical data).
        queries: a :class:`~memgas_gpu.lexical.terms.TermMatrix`, one row per query.
        query_conversation: ``[Q]`` position in ``view`` of each query's conversation.
        specs: ``{name: (document set, reduce)}`` of the signals to compute (the signal
            registry's :func:`~memgas_gpu.retrieve.signals.lexical_specs`; ``reduce``:
            ``"sum"``, ``"max"`` or ``"mean"`` over a session's documents).
        params: :class:`BM25Params`.
        device: where to compute (default: CUDA if available).
        max_nnz: document terms per conversation chunk when the postings are built.
        lexical: a :class:`~memgas_gpu.lexical.LexicalIndex` to use instead of
            ``view.lexical`` (same distinct sessions, e.g. another tokenizer); its own
            postings cache is used.
        postings: ``postings(granularity, params, device) -> GranularityPostings`` (a
            view of a memory assembles them from its conversations'); default
            :func:`lexical_postings`.
    """
    index = view
    lex = lexical if lexical is not None else view.lexical
    if lex is None:
        raise ValueError("this index has no lexical data: build it with lexical=True")
    names = list(specs)
    spec = specs
    missing = sorted({spec[n][0] for n in names} - set(lex.docs))
    if missing:
        raise ValueError(f"this index stores no lexical documents {missing} (signals "
                         f"{[n for n in names if spec[n][0] in missing]})")
    p = params or BM25Params()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    conv = torch.as_tensor(query_conversation, dtype=torch.long).cpu()
    if conv.numel() != queries.n_rows:
        raise ValueError(f"query_conversation has {conv.numel()} entries but queries "
                         f"has {queries.n_rows} rows")
    if conv.numel() and (int(conv.min()) < 0 or int(conv.max()) >= view.n_conversations):
        raise ValueError(f"query_conversation out of range [0, {view.n_conversations})")
    qmat = queries
    sizes = index.conv_offsets[1:] - index.conv_offsets[:-1]
    n = sizes[conv]
    n_max = int(n.max()) if n.numel() else 0
    Q = conv.numel()
    out = {name: torch.zeros(Q, n_max, dtype=torch.float32, device=dev) for name in names}
    grans = list(dict.fromkeys(spec[x][0] for x in names))
    if Q == 0 or not grans or n_max == 0:
        return out
    qm = qmat.to(dev)
    conv_d = conv.to(dev)
    for g in grans:
        gp = (postings(g, p, dev) if postings is not None and lexical is None
              else lexical_postings(index, g, p, dev, max_nnz, lexical=lex))
        q, doc, val = bm25_gather(gp.post, qm.indptr, qm.indices, qm.tf, conv_d)
        val = val.float()
        flat = gp.doc_session.index_select(0, doc).add_(q * n_max)
        for name in names:
            if spec[name][0] != g:
                continue
            o = out[name].view(-1)
            reduce = spec[name][1]
            if reduce == "max":  # per-document sums first, then the max over documents
                n_docs = max(int(gp.doc_session.numel()), 1)
                key, inv = torch.unique(q * n_docs + doc, return_inverse=True)
                turn = torch.zeros(key.numel(), device=dev).index_add_(0, inv, val)
                qd, dd = key // n_docs, key % n_docs
                o.scatter_reduce_(0, qd * n_max + gp.doc_session[dd], turn, "amax")
            elif reduce == "mean":
                o.index_add_(0, flat, val * gp.doc_weight.index_select(0, doc))
            else:
                o.index_add_(0, flat, val)
    return out
