"""The signal registry: every score of a query against the sessions of its conversation.

A *signal* is a ``[Q, N]`` score of each query against the N sessions of its own
conversation, attached to one granularity node of the association graph (where its
weight seeds PageRank).  The registry is the only home of a signal: adding one is one
:func:`register` call, and everything else derives from what it declares:

* a signal over data the index already stores names the function that computes it
  (a function may compute several signals that share work, e.g. the four dense
  granularity cosines come from one product per conversation) and what it ``needs``;
* a signal over a text of its own passes ``text(session, summary, keywords) -> str``:
  ``MemoryIndex.build`` and ``add_session`` store that text of every session (dense: its
  embedding, scored by ``<q, x>``; lexical: its tokens, one BM25 document per session),
  ``save`` / ``load`` keep it, and :func:`available` knows whether a view has it;
* a lexical signal scores one document set (``docs``: a granularity's documents, or its
  own) and says how the documents of a session combine (``reduce``: ``"sum"``,
  ``"max"``, ``"mean"``).

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

import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ..granularity import N_GRAN, expand_ranges, granularity
from ..ops.query_layout import Layout, query_layout
from ..ops.sparse import quiet_sparse_warnings
from .cues.speaker import speaker_turn_bm25
from .cues.time import time_cue

__all__ = ["Signal", "SIGNALS", "register", "QueryBatch", "Layout", "SignalContext",
           "compute_signals", "compute_cues", "cue_weights", "fused_signals", "query_layout",
           "signal_nodes", "available", "signal_texts", "lexical_specs", "concat_text",
           "RESERVED_TABLES", "MODULE_NAME", "custom_signal_modules", "import_signal_modules"]


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
    """What signal functions read: the view, the queries, their layout, the device, the
    read settings (:class:`~memgas_gpu.retrieve.ReadParams`: BM25's ``k1``, ``b``,
    ``bm25_method``, the cues' settings, ...) and optionally another lexical index (the
    sweep's tokenizer grid)."""

    view: Any
    batch: QueryBatch
    layout: Layout
    device: torch.device
    params: Any
    lexical: Any = None

    def lexical_specs(self, names: Sequence[str]) -> dict:
        """``{name: (docs, reduce)}`` of lexical signals (see :func:`lexical_specs`)."""
        return lexical_specs(names)


@dataclass(frozen=True)
class Signal:
    """A registered signal (see the module docstring).

    Attributes:
        name: its name in ``ReadParams.signals``.
        node: the granularity code whose graph nodes it seeds.
        kind: ``"dense"``, ``"lexical"`` (fused by the read path) or ``"cue"`` (added to
            the fused scores, weighted).
        compute: ``compute(ctx, names) -> {name: [Q, N]}`` (every requested signal it
            owns).
        description: one line for listings.
        needs: what it reads from the index: ``"gran"``, ``"turns"``, a dense table
            name, or ``"lexical:<docs>"``.
        text: ``text(session, summary, keywords) -> str`` of a signal with stored data
            of its own (its dense ``table`` or its lexical ``docs``), or None.
        table: the dense table it reads (``"concat"`` for ``dense_concat``), or None.
        docs: the lexical document set it scores (``"S"``, ``"T"``, ``"U"``, ``"K"`` or
            its own name), or None.
        reduce: how a session's lexical documents combine: ``"sum"``, ``"max"``,
            ``"mean"``.
        weight: a cue's weight: the :class:`~memgas_gpu.retrieve.ReadParams` setting
            that holds it (``"time_beta"``), or None: its entry in ``ReadParams.cues``.
        module: the module that registered it (recorded with a saved index, and
            imported again when the index is loaded in another process).
    """

    name: str
    node: str
    kind: str
    compute: Callable[[SignalContext, Sequence[str]], dict]
    description: str = ""
    needs: tuple = ()
    text: Optional[Callable] = None
    table: Optional[str] = None
    docs: Optional[str] = None
    reduce: str = "sum"
    weight: Optional[str] = None
    module: str = ""

    @property
    def node_index(self) -> int:
        return granularity(self.node).index


SIGNALS: dict[str, Signal] = {}
#: names a dense table may not take (the index's own tensors)
RESERVED_TABLES = frozenset({"gran", "turns", "turn_ptr", "q_emb", "q_conv", "row_slot",
                             "conv_offsets"})
REDUCTIONS = ("sum", "max", "mean")
KINDS = ("dense", "lexical", "cue")


def register(name: str, node: str, kind: str, compute: Optional[Callable] = None,
             description: str = "", *, needs: Sequence[str] = (),
             text: Optional[Callable] = None, table: Optional[str] = None,
             docs: Optional[str] = None, reduce: str = "sum",
             weight: Optional[str] = None) -> Signal:
    """Add a signal to :data:`SIGNALS` (see the module docstring); a name registered
    again replaces the earlier signal.

    Args:
        name: the signal's name.
        node: granularity name or code whose nodes it seeds.
        kind: ``"dense"``, ``"lexical"`` or ``"cue"`` (a ``[Q, N]`` score added to the
            fused session scores times its weight: ``ReadParams.cues[name]``, or the
            setting named by ``weight``).
        compute: the function computing it (default: the generic one of its kind: the
            dot product with its stored table, or BM25 over its documents).
        description: one line.
        needs: stored data it reads, for a ``compute`` of your own.
        text: ``text(session, summary, keywords) -> str``: the text the index stores for
            this signal (dense: in ``table``, default the signal's name; lexical: as the
            document set ``docs``, default the signal's name).
        table: the dense table it reads.
        docs: the lexical document set it scores (a granularity code or a ``text``
            signal's own).
        reduce: lexical: ``"sum"`` (one document per session: its score), ``"max"`` or
            ``"mean"`` over a session's documents.
        weight: cue: the ReadParams setting holding its weight (default: its entry in
            ``ReadParams.cues``).

    Raises:
        ValueError: a malformed declaration (nothing registered).
    """
    if not isinstance(name, str) or not name or "+" in name or "." in name:
        raise ValueError(f"a signal name is a non-empty string without '+' or '.', got "
                         f"{name!r}")
    code = granularity(node).code
    if kind not in KINDS:
        raise ValueError(f"signal {name!r}: kind must be one of {KINDS}, got {kind!r}")
    if reduce not in REDUCTIONS:
        raise ValueError(f"signal {name!r}: reduce must be one of {REDUCTIONS}, got "
                         f"{reduce!r}")
    if text is not None and not callable(text):
        raise ValueError(f"signal {name!r}: text must be callable(session, summary, "
                         "keywords) -> str")
    needs = tuple(needs)
    if kind == "cue":
        if compute is None or text is not None or table is not None or docs is not None:
            raise ValueError(f"cue {name!r} needs compute= (over the view's data) and "
                             "stores nothing of its own")
    elif kind == "dense":
        if text is not None or table is not None:
            table = table or name
            if table in RESERVED_TABLES or "." in table:
                raise ValueError(f"signal {name!r}: table name {table!r} is reserved")
            needs = (table,)
            compute = compute or _dense_table
        elif compute is None:
            raise ValueError(f"dense signal {name!r} needs text= (data of its own) or "
                             "compute= (over stored data)")
    else:
        docs = docs or (name if text is not None else None)
        if docs is None:
            raise ValueError(f"lexical signal {name!r} needs docs= (a granularity code) or "
                             "text= (documents of its own)")
        needs = (f"lexical:{docs}",)
        compute = compute or _bm25
    module = sys._getframe(1).f_globals.get("__name__", "")
    sig = Signal(name, code, kind, compute, description, needs, text, table, docs, reduce,
                 weight if kind == "cue" else None, module)
    SIGNALS[name] = sig
    return sig


#: a module name a saved index may ask to import (dotted identifiers)
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,9}")


def custom_signal_modules() -> dict:
    """``{signal: module}`` of the registered signals that are not memgas_gpu's own (what
    a save records, so that a load in another process finds them again)."""
    return {n: s.module for n, s in SIGNALS.items()
            if s.module and s.module != "__main__" and s.module != "memgas_gpu"
            and not s.module.startswith("memgas_gpu.") and MODULE_NAME.fullmatch(s.module)}


def import_signal_modules(modules: dict) -> list:
    """Import the modules that registered the signals ``modules`` names (``{signal:
    module}``, recorded by a save), for the signals not registered yet; returns one line
    per signal that stays unregistered (the module is missing, fails, or does not
    register it).  ``MEMGAS_IMPORT_SIGNALS=0`` in the environment turns it off: an
    index from someone else then imports nothing."""
    missing = {n: m for n, m in modules.items() if n not in SIGNALS}
    if not missing:
        return []
    if os.environ.get("MEMGAS_IMPORT_SIGNALS", "1").strip() == "0":
        return [f"signal {n!r} is not registered (its module {m!r} is not imported: "
                "MEMGAS_IMPORT_SIGNALS=0)" for n, m in sorted(missing.items())]
    out = []
    for n, m in sorted(missing.items()):
        if n in SIGNALS:
            continue
        if not MODULE_NAME.fullmatch(m):
            out.append(f"signal {n!r}: {m[:80]!r} is not a module name; not imported")
            continue
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - any failure of someone else's module
            out.append(f"signal {n!r}: importing its module {m!r} failed "
                       f"({type(e).__name__}: {' '.join(str(e).split())[:120]})")
            continue
        if n not in SIGNALS:
            out.append(f"signal {n!r}: module {m!r} does not register it")
    return out


def fused_signals() -> tuple:
    """The names ``ReadParams.signals`` may hold (every signal but the cues)."""
    return tuple(n for n, s in SIGNALS.items() if s.kind != "cue")


def cue_weights(p) -> dict:
    """``{cue: weight}`` of the registered cues ``p`` (ReadParams) weighs above 0.

    Raises:
        ValueError: ``p.cues`` names a signal that is not a registered cue.
    """
    given = dict(p.cues)
    bad = [n for n in given if n not in SIGNALS or SIGNALS[n].kind != "cue"]
    if bad:
        cues = [n for n, s in SIGNALS.items() if s.kind == "cue"]
        raise ValueError(f"unknown cue(s) {bad}; the registered cues are {cues}")
    out = {}
    for n, s in SIGNALS.items():
        if s.kind == "cue":
            w = float(getattr(p, s.weight)) if s.weight else float(given.get(n, 0.0))
            if w:
                out[n] = w
    return out


def signal_texts(kind: str) -> dict:
    """``{table or docs: text function}`` of the registered signals of ``kind`` that store
    a text of their own (what ``MemoryIndex.build`` and ``add_session`` store)."""
    out = {}
    for s in SIGNALS.values():
        if s.kind == kind and s.text is not None:
            out[s.table if kind == "dense" else s.docs] = s.text
    return out


def lexical_specs(names: Sequence[str]) -> dict:
    """``{name: (docs, reduce)}`` of lexical signals (what BM25 scores and combines)."""
    return {n: (SIGNALS[n].docs, SIGNALS[n].reduce) for n in names}


def _per_conversation(ctx: SignalContext):
    """``(c, query positions, first row, end row)`` of each queried conversation (one
    stable sort, not one scan of the queries per conversation)."""
    conv = ctx.batch.q_conv.to(torch.int64).cpu()
    order = torch.argsort(conv, stable=True)
    convs, counts = torch.unique_consecutive(conv[order], return_counts=True)
    offs = ctx.view.conv_offsets.tolist()
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
    idx, dev = ctx.view, ctx.device
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
    Q, N = qe.shape[0], lay.n_max
    table = idx.gran.reshape(-1, idx.dim)
    slots = idx.row_slot[lay.rows]  # [Q, N]
    col = (slots[:, :, None] * N_GRAN + torch.arange(N_GRAN)).reshape(Q, N * N_GRAN)
    ok = lay.valid[:, :, None].expand(Q, N, N_GRAN).reshape(Q, N * N_GRAN)
    crow = torch.zeros(Q + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(ok.sum(1), 0)
    out = torch.zeros(Q, N, N_GRAN, dtype=dt, device=dev)
    if int(crow[-1]):
        with quiet_sparse_warnings():
            pat = torch.sparse_csr_tensor(crow.to(dev), col[ok].to(dev),
                                          torch.zeros(int(crow[-1]), dtype=dt, device=dev),
                                          (Q, table.shape[0]), check_invariants=False)
            vals = torch.sparse.sampled_addmm(pat, qe, table.to(device=dev, dtype=dt).T,
                                              beta=0.0).values()
        out.view(Q, N * N_GRAN)[ok.to(dev)] = vals
    return out.transpose(1, 2)


def _dense_best_turn(ctx: SignalContext, names: Sequence[str]) -> dict:
    """``dense_Tmax``: max over each session's turns of ``<q, turn>`` (-1 without turns)."""
    idx, dev = ctx.view, ctx.device
    if idx.turns is None:
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


def _dense_table(ctx: SignalContext, names: Sequence[str]) -> dict:
    """Signals with a dense table of their own (``dense_concat``: the reference's "hybrid"
    text, summary + keywords + session): ``<q, x>``, one product per conversation."""
    idx, dev = ctx.view, ctx.device
    Q, N = len(ctx.batch), ctx.layout.n_max
    out = {}
    for name in names:
        table = SIGNALS[name].table
        x_all = idx.dense_table(table)
        if x_all is None:
            raise ValueError(f"signal {name} needs the table {table!r}, which this index does "
                             "not store" + (" (built with concat=False)"
                                            if table == "concat" else ""))
        o = torch.zeros(Q, N, dtype=torch.float32, device=dev)
        for _, qs, a, b in _per_conversation(ctx):
            x = x_all[idx.row_slot[a:b]].to(dev)
            o[qs.to(dev), :b - a] = (ctx.batch.q_emb[qs].to(dev) @ x.T).float()
        out[name] = o
    return out


def _bm25(ctx: SignalContext, names: Sequence[str]) -> dict:
    from ..lexical import BM25Params, lexical_signals

    if ctx.batch.q_terms is None:
        raise ValueError("lexical signals need the queries' term counts (an index built "
                         "with lexical=True)")
    p = ctx.params
    return lexical_signals(ctx.view, ctx.batch.q_terms, ctx.batch.q_conv, lexical_specs(names),
                           params=BM25Params(p.k1, p.b, p.bm25_method),
                           device=str(ctx.device), lexical=ctx.lexical,
                           postings=ctx.view.postings)


def concat_text(session, summary: str, keywords: str) -> str:
    """The reference's "hybrid" text of a session: summary, keywords, session text."""
    return f"{summary} {keywords} {session.text}"


for _g in ("S", "T", "U", "K"):
    register(f"dense_{_g}", _g, "dense", _dense_nodes,
             f"<q, x> with the {granularity(_g).name} embedding", needs=("gran",))
register("dense_Tmax", "T", "dense", _dense_best_turn, "best turn: max_t <q, turn_t>",
         needs=("turns",))
register("dense_concat", "S", "dense", description=
         '<q, embedding of "{summary} {keywords} {session}">', text=concat_text,
         table="concat")
register("bm25_S", "S", "lexical", description="BM25 against the session text", docs="S")
register("bm25_Tmax", "T", "lexical", speaker_turn_bm25,
         "best turn by BM25 (the named speaker's messages weighted: speaker_gamma)",
         docs="T", reduce="max")
register("bm25_Tmean", "T", "lexical", description="mean turn BM25", docs="T", reduce="mean")
register("bm25_U", "U", "lexical", description="BM25 against the summary", docs="U")
register("bm25_K", "K", "lexical", description="BM25 against the keywords", docs="K")
register("time", "S", "cue", time_cue, "1 for a session dated inside the query's date "
         "expression", weight="time_beta")


def compute_signals(ctx: SignalContext, names: Sequence[str]) -> Tensor:
    """Raw signals ``[Q, S, N_max]`` in the order of ``names`` (padding 0).

    Each signal function runs once for all the names it owns.  The result is float64
    when any signal is, else float32.
    """
    bad = [n for n in names if n not in SIGNALS]
    if bad or not names:
        raise ValueError(f"unknown signal(s) {bad}; choose from {', '.join(SIGNALS)}")
    cues = [n for n in names if SIGNALS[n].kind == "cue"]
    if cues:
        raise ValueError(f"{cues} are cues: they are added to the fused scores (weights in "
                         "ReadParams.cues), not fused as signals")
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


def available(view, names: Optional[Sequence[str]] = None) -> list[str]:
    """The signals (of ``names``, default every fused one) ``view`` holds the data of."""
    return [n for n in names or fused_signals()
            if all(view.provides(x) for x in SIGNALS[n].needs)]


def compute_cues(ctx: SignalContext, names: Sequence[str]) -> dict:
    """``{cue: [Q, N_max]}`` of the cues ``names`` (unweighted; 0 past a conversation's
    end)."""
    got: dict = {}
    for fn in dict.fromkeys(SIGNALS[n].compute for n in names):
        got.update(fn(ctx, [n for n in names if SIGNALS[n].compute is fn]))
    valid = ctx.layout.valid.to(ctx.device)
    return {n: torch.where(valid, got[n], torch.zeros_like(got[n])) for n in names}
