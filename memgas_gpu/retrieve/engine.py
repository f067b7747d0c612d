"""The one read path: signals → normalise → route → seeds → propagate → session scores.

Every retrieval method is a named preset of one settings object, :class:`ReadParams`
(docs/algorithm.md, "Read path", states each stage and where each default comes from):

1. **signals**: raw ``[Q, S, N]`` scores of each query against the sessions of its
   conversation (:mod:`memgas_gpu.retrieve.signals`);
2. **normalise** each signal over the query's sessions (``norm``);
3. **route**: weight the signals by the entropy of their softmax (``router``,
   ``temperature``), or uniformly;
4. **fuse**: ``"sum"`` (Σ w·z), ``"rrf"`` (Σ w / (60 + rank)), or onto the granularity
   nodes of the association graph, keeping the top ``alpha`` as seeds (``"seeds"``:
   summed per session) and
5. **propagate** them by personalized PageRank (``"ppr"``, damping ``damping``) over
   the ``graph`` (``"dense"``: the MemGAS GMM graph; ``"topk"``; ``"lexical"``;
   ``"both"``; ``"none"``: no edges);
6. **session scores**: the mass of a session's nodes, added.

:func:`read_path` is steps 2-6 on tensors; :func:`score` runs all of it for a
:class:`~memgas_gpu.retrieve.signals.QueryBatch` against a memory index.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import ops
from .._checks import resolve_device
from ..choices import FUSIONS, GRAPHS, ROUTERS
from ..errors import MemgasError
from ..granularity import N_GRAN
from ..settings import SettingsError
from .params import MEMGAS_SIGNALS, ReadParams
from .presets import (DEFAULT_METHOD, HYBRID_EXTRACTIVE_SIGNALS, HYBRID_SIGNALS, METHODS,
                      PRESETS)
from .signals import (SIGNALS, QueryBatch, SignalContext, available, compute_cues,
                      compute_signals, cue_weights, query_layout, signal_nodes)

__all__ = ["ReadParams", "PRESETS", "METHODS", "DEFAULT_METHOD", "HYBRID_SIGNALS",
           "HYBRID_EXTRACTIVE_SIGNALS", "FUSIONS", "GRAPHS", "ROUTERS", "NonFiniteScoresError",
           "SettingsError", "resolve", "read_path", "score", "auto_signals"]

class NonFiniteScoresError(MemgasError):
    """Retrieval produced NaN or infinite scores (bad embeddings or settings);
    ``queries`` lists the positions of the affected queries in the batch."""

    def __init__(self, message: str, queries=()) -> None:
        super().__init__(message)
        self.queries = list(queries)


_FIELDS = {f.name for f in fields(ReadParams)}


def auto_signals(view) -> tuple[tuple, str]:
    """The rule behind ``signals="auto"``: :data:`HYBRID_EXTRACTIVE_SIGNALS` when the
    view's summaries are extractive (copied sentences), else :data:`HYBRID_SIGNALS`;
    of those, the ones the view holds the data of (an index built with
    ``lexical=False`` or ``keep_turns=False`` drops the BM25 or the best-turn signals; with
    none left, the four dense granularities of :data:`MEMGAS_SIGNALS`).  ``view`` None:
    the rule alone (no data to check).

    Returns:
        ``(signals, reason)``; the reason is printed by ``memgas eval`` and recorded.
    """
    config = view.config if view is not None else None
    exp = config.get("expansion") if isinstance(config, dict) else None
    summ = exp.get("summaries") if isinstance(exp, dict) else None
    if isinstance(summ, dict) and summ.get("method") == "offline":
        sig, why = (HYBRID_EXTRACTIVE_SIGNALS,
                    "summaries are extractive (offline): U signals left out")
    else:
        sig, why = HYBRID_SIGNALS, "summaries are written (not extractive)"
    if view is None:
        return sig, why
    have = tuple(available(view, sig))
    if have != sig:
        gone = [s for s in sig if s not in have]
        why += (f"; {', '.join(gone)} left out: the index does not store their data "
                "(built with lexical=False or keep_turns=False)")
        if not have:
            have, why = MEMGAS_SIGNALS, why + "; the dense granularities instead"
    return have, why


def resolve(view, method: str = "memgas", params: Optional[ReadParams] = None,
            **overrides) -> tuple[ReadParams, dict]:
    """The checked settings of ``method`` (its preset, or ``params``) with ``overrides``,
    for the data ``view`` holds (None: the settings alone).

    Returns:
        ``(params, info)``: ``info`` says how ``signals="auto"`` was resolved, and that
        the speaker cue was switched off for an index without turn texts (empty when
        neither applies).
    """
    if method not in PRESETS:
        raise SettingsError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    bad = [k for k in overrides if k not in _FIELDS]
    if bad:
        raise SettingsError(f"unknown setting(s) {bad}; settings are {', '.join(sorted(_FIELDS))}")
    p = replace(params if params is not None else PRESETS[method],
                **{k: v for k, v in overrides.items() if v is not None}).check()
    info = {}
    if p.signals == "auto":
        sig, why = auto_signals(view)
        p = replace(p, signals=sig)
        info = {"signals": "auto", "resolved": "+".join(sig), "reason": why}
    if (p.speaker_gamma and "bm25_Tmax" in p.signals and view is not None
            and not view.keeps_text):
        p = replace(p, speaker_gamma=0.0)
        info["speaker_gamma"] = "off: the index keeps no turn texts (built with keep_text=False)"
    return p, info


def read_path(x: Tensor, valid: Tensor, p: ReadParams, *, node_of_signal: Sequence[int],
              n_gran: int = N_GRAN, graph: Optional[tuple] = None,
              node_base: Optional[Tensor] = None, query_conversation: Optional[Tensor] = None,
              blocks: Optional[Tensor] = None, backend: str = "auto") -> Tensor:
    """Steps 2-6 of the read path on raw signals.

    Args:
        x: ``[Q, S, N]`` raw signals, in the order of ``p.signals``.
        valid: ``[Q, N]`` bool, the query's real sessions.
        p: checked :class:`ReadParams`.
        node_of_signal: granularity node index of each signal.
        n_gran: granularity nodes per session.
        graph: ``(indptr, indices)`` of the block-diagonal graph (``fusion="ppr"``).
        node_base: ``[Q]`` id of the first graph node of each query's conversation
            (sessions are ``n_gran`` interleaved nodes each).
        query_conversation: ``[Q]`` block of each query; blocks: ``[n]`` block per node.
        backend: PageRank backend.

    Returns:
        ``[Q, N]`` session scores (float64 for ``seeds``/``ppr``; padding arbitrary).
    """
    z = ops.normalise_signals(x if p.norm == "none" else x.double(), valid, p.norm)
    Q, S, N = z.shape
    if p.router == "uniform":
        w = torch.full((Q, S), 1.0 / S, dtype=z.dtype, device=z.device)
    else:
        w = ops.entropy_router(z, p.temperature, p.router, valid[:, None, :])
    if p.fusion == "sum":
        return ops.weighted_sum(z, w)
    if p.fusion == "rrf":
        return ops.reciprocal_rank_fusion(z, w, valid)
    node = ops.node_scores(z, w, node_of_signal, n_gran)  # [Q, G, N]
    ok = valid[:, None, :].expand(Q, n_gran, N)
    seeds = ops.seed_scores(node.reshape(Q, n_gran * N), p.alpha, ok.reshape(Q, n_gran * N))
    seeds = seeds.to(torch.float64)
    if p.fusion == "ppr":
        dev = z.device
        pos = (node_base.to(dev)[:, None, None]
               + torch.arange(N, device=dev)[None, None, :] * n_gran
               + torch.arange(n_gran, device=dev)[None, :, None]).reshape(Q, n_gran * N)
        seeds = ops.propagate(seeds, pos, ok.reshape(Q, n_gran * N), query_conversation,
                              graph[0], graph[1], blocks, p.damping, backend=backend)
    return ops.sum_granularities(seeds.view(Q, n_gran, N))


def score(view, batch: QueryBatch, p: ReadParams, device: Optional[str] = None,
          lexical=None, backend: str = "auto") -> tuple[Tensor, Tensor]:
    """Session scores of every query of ``batch`` against its conversation.

    Args:
        view: a :class:`~memgas_gpu.memory.segments.View` holding the conversations
            the queries ask about (``batch.q_conv``: positions in it).
        batch: the queries.
        p: checked settings with concrete signals (see :func:`resolve`).
        device: where to compute (default: CUDA if available).
        lexical: optional lexical index replacing ``view.lexical``.
        backend: PageRank backend (``"auto"``, ``"native"``, ``"torch"``).

    Returns:
        ``(scores [Q, N_max] float (-inf padding), n_sessions [Q])``.

    Raises:
        NonFiniteScoresError: a real session got a NaN or infinite score.
    """
    from .graphs import read_graph

    dev = resolve_device(device)
    lay = query_layout(view.conv_offsets, batch.q_conv)
    ctx = SignalContext(view, batch, lay, dev, p, lexical)
    x = compute_signals(ctx, p.signals)
    cues = compute_cues(ctx, list(cue_weights(p)))
    return finish(view, x, lay, p, dev, read_graph(view, p, dev), backend, cues)


def finish(view, x: Tensor, lay, p: ReadParams, dev: torch.device,
           graph: Optional[tuple], backend: str = "auto",
           cues: Optional[dict] = None) -> tuple[Tensor, Tensor]:
    """Steps 2-6 for raw signals ``x`` of queries laid out as ``lay`` (the sweep reuses
    one ``x`` and ``cues`` for many settings), plus each cue of ``cues`` (``{name: [Q,
    N]}``, unweighted) times its weight in ``p``; see :func:`score`."""
    valid = lay.valid.to(dev)
    _refuse_non_finite(x, valid[:, None, :].expand_as(x), "signal values")
    blocks = None
    if graph is not None:
        blocks = view.cache.get("node_blocks")
        if blocks is None:
            sizes = view.conv_offsets[1:] - view.conv_offsets[:-1]
            blocks = torch.repeat_interleave(torch.arange(view.n_conversations),
                                             sizes).repeat_interleave(N_GRAN)
            view.cache["node_blocks"] = blocks
    s = read_path(x, valid, p, node_of_signal=signal_nodes(p.signals), graph=graph,
                  node_base=lay.start * N_GRAN, query_conversation=lay.conv, blocks=blocks,
                  backend=backend)
    for name, w in cue_weights(p).items():
        if cues is None or name not in cues:
            raise ValueError(f"the settings weigh the cue {name!r}, which was not computed")
        s = s + w * cues[name].to(s.device, s.dtype)
    _refuse_non_finite(s, valid, "scores")
    return s.masked_fill(~valid, float("-inf")), lay.n


def _refuse_non_finite(x: Tensor, valid: Tensor, what: str) -> None:
    bad = valid & ~torch.isfinite(x)
    if bool(bad.any()):
        rows = torch.nonzero(bad.reshape(bad.shape[0], -1).any(1)).squeeze(1).cpu()
        raise NonFiniteScoresError(
            f"non-finite {what} for {rows.numel()} of {x.shape[0]} queries (first: query "
            f"{int(rows[0])}): the index's or the query's embeddings contain NaN/inf, or "
            "the settings overflow", rows.tolist())
