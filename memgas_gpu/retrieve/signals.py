"""The signal registry: every score of a query against the sessions of its conversation.

A *signal* is a ``[Q, N]`` score of each query against the N sessions of its own
conversation, attached to one granularity node of the association graph (where its
weight seeds PageRank).  Adding a signal is one :func:`register` call with the function
that computes it (a function may compute several signals that share work, e.g. the four
dense granularity cosines come from one product per conversation).

=============== ======================================================== ====
signal          score of session i for query q                           node
=============== ======================================================== ====
``dense_S/T/U/K`` ``<q, x>`` with the S, T (mean of turns), U, K embedding  S/T/U/K
``dense_Tmax``  best turn: ``max_t <q, turn_t>`` (-1 without turns)      T
``dense_concat`` ``<q, embedding of "{summary} {keywords} {session}">``  S
``bm25_S``      BM25 of q against the session text (corpus: the          S
                conversation's sessions)
``bm25_Tmax``   best turn by BM25 (corpus: the conversation's turns)     T
``bm25_Tmean``  mean turn BM25                                           T
``bm25_U``      BM25 against the summary (corpus: the summaries)         U
``bm25_K``      BM25 against the keywords (corpus: the keyword lists)    K
=============== ======================================================== ====
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ..granularity import N_GRAN, expand_ranges, granularity
from ..ops.query_layout import Layout, query_layout

__all__ = ["Signal", "SIGNALS", "register", "QueryBatch", "Layout", "SignalContext",
           "compute_signals", "query_layout", "signal_nodes", "available"]


@dataclass
class QueryBatch:
    """Queries to score: embeddings, conversation, and lexical term counts.

    Attributes:
        q_emb: ``[Q, d]`` query embeddings (the index's encoder).
        q_conv: ``[Q]`` int64 conversation index of each query.
        q_terms: a :class:`~memgas_gpu.lexical.TermMatrix` with one row per query, or
            None (lexical signals then unavailable).
        q_text: the query texts (the time cue reads their date expressions), or None.
        q_date: the date each query was asked (``None`` entries allowed), or None.
    """

    q_emb: Tensor
    q_conv: Tensor
    q_terms: Any = None
    q_text: Optional[list] = None
    q_date: Optional[list] = None

    def __len__(self) -> int:
        return int(self.q_conv.numel())


@dataclass
class SignalContext:
    """What signal functions read: the index, the queries, their layout, the device,
    BM25 settings and optionally another lexical index (the sweep's tokenizer grid)."""

    index: Any
    batch: QueryBatch
    layout: Layout
    device: torch.device
    k1: float = 1.5
    b: float = 0.75
    bm25_method: str = "lucene"
    lexical: Any = None
    speaker_gamma: float = 0.0


@dataclass(frozen=True)
class Signal:
    """A registered signal: ``name``, the granularity ``node`` (code) it seeds,
    ``kind`` (``"dense"`` or ``"lexical"``), and ``compute(ctx, names) -> {name: [Q, N]}``
    (computes every requested signal it owns)."""

    name: str
    node: str
    kind: str
    compute: Callable[[SignalContext, Sequence[str]], dict]
    description: str = ""

    @property
    def node_index(self) -> int:
        return granularity(self.node).index


SIGNALS: dict[str, Signal] = {}


def register(name: str, node: str, kind: str, compute: Callable,
             description: str = "") -> Signal:
    """Add a signal to :data:`SIGNALS` (``node``: granularity name or code)."""
    sig = Signal(name, granularity(node).code, kind, compute, description)
    SIGNALS[name] = sig
    return sig


def _per_conversation(ctx: SignalContext):
    """``(c, query positions, first row, end row)`` of each queried conversation (one
    stable sort, not one scan of the queries per conversation)."""
    conv = ctx.batch.q_conv.to(torch.int64).cpu()
    order = torch.argsort(conv, stable=True)
    convs, counts = torch.unique_consecutive(conv[order], return_counts=True)
    offs = ctx.index.conv_offsets.tolist()
    o = 0
    for c, k in zip(convs.tolist(), counts.tolist()):
        yield c, order[o:o + k], offs[c], offs[c + 1]
        o += k


#: queries per conversation from which one matrix product per conversation (over a copy
#: of its node embeddings) beats one sampled product over the distinct-session table
PER_CONVERSATION_FROM = 8


def _dense_nodes(ctx: SignalContext, names: Sequence[str]) -> dict:
    """``dense_S/T/U/K``: every query against the G nodes of each of its sessions.

    Two ways, chosen by the batch's shape (docs/performance.md, "Read path"): with many
    queries per conversation, one ``[q_c, d] @ [d, G n_c]`` product per conversation (the
    copy of its embeddings is shared by its queries); with few (LongMemEval: one question
    per haystack), one sampled product over the distinct-session table (no copy, no loop
    over conversations).  Both compute the same dot products; float32 rounding may
    differ in the last bit.  Float64 when the index is float64.
    """
    idx, dev = ctx.index, ctx.device
    lay = ctx.layout
    Q, N = len(ctx.batch), lay.n_max
    dt = torch.float64 if idx.gran.dtype == torch.float64 else torch.float32
    out = torch.zeros(Q, N_GRAN, N, dtype=dt, device=dev)
    qe = ctx.batch.q_emb.to(device=dev, dtype=dt)
    n_conv = int(torch.unique(ctx.batch.q_conv).numel()) if Q else 0
    if Q and Q >= PER_CONVERSATION_FROM * n_conv:
        for _, qs, a, b in _per_conversation(ctx):
            emb = idx.node_embeddings(torch.arange(a, b)).to(device=dev, dtype=dt)
            qd = qs.to(dev)
            sims = qe[qd] @ emb.T  # [q, G * n]
            out[qd, :, :b - a] = sims.view(qd.numel(), b - a, N_GRAN).transpose(1, 2)
    elif Q:
        out = _sampled_nodes(idx, qe, lay, dt, dev)
    return {n: out[:, granularity(SIGNALS[n].node).index] for n in names}


def _sampled_nodes(idx, qe: Tensor, lay: Layout, dt, dev) -> Tensor:
    """``[Q, G, N]`` dot products of each query with the nodes of its sessions, read from
    the distinct-session table by one ``sampled_addmm`` (node g of slot s is row
    ``G s + g`` of ``gran.reshape(-1, d)``)."""
    import warnings

    Q, N = qe.shape[0], lay.n_max
    table = idx.gran.reshape(-1, idx.dim)
    slots = idx.row_slot[lay.rows]  # [Q, N]
    col = (slots[:, :, None] * N_GRAN + torch.arange(N_GRAN)).reshape(Q, N * N_GRAN)
    ok = lay.valid[:, :, None].expand(Q, N, N_GRAN).reshape(Q, N * N_GRAN)
    crow = torch.zeros(Q + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(ok.sum(1), 0)
    out = torch.zeros(Q, N, N_GRAN, dtype=dt, device=dev)
    if int(crow[-1]):
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            pat = torch.sparse_csr_tensor(crow.to(dev), col[ok].to(dev),
                                          torch.zeros(int(crow[-1]), dtype=dt, device=dev),
                                          (Q, table.shape[0]), check_invariants=False)
            vals = torch.sparse.sampled_addmm(pat, qe, table.to(device=dev, dtype=dt).T,
                                              beta=0.0).values()
        out.view(Q, N * N_GRAN)[ok.to(dev)] = vals
    return out.transpose(1, 2)


def _dense_best_turn(ctx: SignalContext, names: Sequence[str]) -> dict:
    """``dense_Tmax``: max over each session's turns of ``<q, turn>`` (-1 without turns)."""
    idx, dev = ctx.index, ctx.device
    if getattr(idx, "turns", None) is None:
        raise ValueError("signal dense_Tmax needs per-turn embeddings: build the index with "
                         "keep_turns=True")
    Q, N = len(ctx.batch), ctx.layout.n_max
    out = torch.full((Q, N), -1.0, dtype=torch.float32, device=dev)
    for _, qs, a, b in _per_conversation(ctx):
        pos, tid = expand_ranges(idx.turn_ptr, idx.row_slot[a:b])
        sims = (ctx.batch.q_emb[qs].to(dev) @ idx.turns[tid].to(dev).T).float()  # [q, turns]
        blk = torch.full((qs.numel(), N), float("-inf"), device=dev)
        blk.scatter_reduce_(1, pos.to(dev)[None].expand_as(sims), sims, "amax")
        out[qs.to(dev)] = torch.where(torch.isinf(blk), torch.full_like(blk, -1.0), blk)
    return {"dense_Tmax": out}


def _dense_concat(ctx: SignalContext, names: Sequence[str]) -> dict:
    """``dense_concat``: the reference's "hybrid" text embedding (summary + keywords +
    session text), one product per conversation."""
    idx, dev = ctx.index, ctx.device
    if getattr(idx, "concat", None) is None:
        raise ValueError("this index was built without concat embeddings (concat=False)")
    Q, N = len(ctx.batch), ctx.layout.n_max
    out = torch.zeros(Q, N, dtype=torch.float32, device=dev)
    for _, qs, a, b in _per_conversation(ctx):
        x = idx.concat[idx.row_slot[a:b]].to(dev)
        out[qs.to(dev), :b - a] = (ctx.batch.q_emb[qs].to(dev) @ x.T).float()
    return {"dense_concat": out}


def _bm25(ctx: SignalContext, names: Sequence[str]) -> dict:
    from ..lexical import BM25Params, lexical_signals

    if ctx.batch.q_terms is None:
        raise ValueError("lexical signals need the queries' term counts (an index built "
                         "with lexical=True)")
    cue = (ctx.speaker_gamma > 0 and "bm25_Tmax" in names and ctx.lexical is None
           and ctx.batch.q_text is not None)
    plain = [n for n in names if not (cue and n == "bm25_Tmax")]
    out = lexical_signals(ctx.index, names=plain,
                          params=BM25Params(ctx.k1, ctx.b, ctx.bm25_method),
                          device=str(ctx.device), queries=ctx.batch.q_terms,
                          query_conversation=ctx.batch.q_conv,
                          lexical=ctx.lexical) if plain else {}
    if cue:
        from .cues import speaker_turn_signal

        out["bm25_Tmax"] = speaker_turn_signal(ctx.index, ctx.batch.q_text, ctx.batch.q_conv,
                                               ctx.batch.q_terms, ctx.layout,
                                               ctx.speaker_gamma, ctx.k1, ctx.b,
                                               ctx.bm25_method, str(ctx.device))
    return out


for _g in ("S", "T", "U", "K"):
    register(f"dense_{_g}", _g, "dense", _dense_nodes,
             f"<q, x> with the {granularity(_g).name} embedding")
register("dense_Tmax", "T", "dense", _dense_best_turn, "best turn: max_t <q, turn_t>")
register("dense_concat", "S", "dense", _dense_concat,
         '<q, embedding of "{summary} {keywords} {session}">')
register("bm25_S", "S", "lexical", _bm25, "BM25 against the session text")
register("bm25_Tmax", "T", "lexical", _bm25, "best turn by BM25")
register("bm25_Tmean", "T", "lexical", _bm25, "mean turn BM25")
register("bm25_U", "U", "lexical", _bm25, "BM25 against the summary")
register("bm25_K", "K", "lexical", _bm25, "BM25 against the keywords")


def compute_signals(ctx: SignalContext, names: Sequence[str]) -> Tensor:
    """Raw signals ``[Q, S, N_max]`` in the order of ``names`` (padding 0).

    Each signal function runs once for all the names it owns.  The result is float64
    when any signal is, else float32.
    """
    bad = [n for n in names if n not in SIGNALS]
    if bad or not names:
        raise ValueError(f"unknown signal(s) {bad}; choose from {', '.join(SIGNALS)}")
    got: dict = {}
    for fn in dict.fromkeys(SIGNALS[n].compute for n in names):
        mine = [n for n in names if SIGNALS[n].compute is fn]
        got.update(fn(ctx, mine))
    dt = torch.float64 if any(got[n].dtype == torch.float64 for n in names) else torch.float32
    x = torch.stack([got[n].to(dt) for n in names], 1)
    valid = ctx.layout.valid.to(ctx.device)[:, None, :]
    return torch.where(valid, x, torch.zeros_like(x))


def signal_nodes(names: Sequence[str]) -> list[int]:
    """The granularity node index of each signal."""
    return [SIGNALS[n].node_index for n in names]


def available(index, names: Optional[Sequence[str]] = None) -> list[str]:
    """The signals (of ``names``, default all) this index can compute."""
    out = []
    for n in names or SIGNALS:
        s = SIGNALS[n]
        if s.kind == "lexical" and getattr(index, "lexical", None) is None:
            continue
        if n == "dense_Tmax" and getattr(index, "turns", None) is None:
            continue
        if n == "dense_concat" and getattr(index, "concat", None) is None:
            continue
        out.append(n)
    return out
