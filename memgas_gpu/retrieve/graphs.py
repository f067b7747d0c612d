"""The association graphs the read path can propagate over (``ReadParams.graph``).

All graphs share the nodes of a :class:`~memgas_gpu.retrieve.MemoryIndex` (``N_GRAN``
interleaved nodes per session row) and are block-diagonal over conversations:

* ``"dense"``: the MemGAS graph (top ``m`` earlier nodes by cosine, kept by the
  2-component GMM test), built with the index;
* ``"topk"``: the ``no_gmm`` ablation, every one of the top ``topk`` candidates kept;
* ``"lexical"``: the same GMM test on BM25-weighted term vectors;
* ``"both"``: the union of ``"dense"`` and ``"lexical"``;
* ``"none"``: no edges (PageRank then returns the normalised seeds).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from torch import Tensor

from .. import ops
from ..granularity import CODES, N_GRAN, expand_ranges
from ..ops.csr import csr_edges, empty_csr, join_csr
from ..progress import Progress
from .params import GraphParams

__all__ = ["read_graph", "lexical_graph", "build_graph", "graph_chunk", "candidates"]


def read_graph(view, p, device) -> Optional[tuple]:
    """The graph ``p.graph`` of ``view`` when ``p.fusion == "ppr"``, else None."""
    if p.fusion != "ppr":
        return None
    dev = str(device)
    if p.graph == "none":
        return empty_csr(view.n_rows * N_GRAN)
    if p.graph == "dense":
        return view.graph(device=dev)
    if p.graph == "topk":
        return view.graph(replace(view.params, rule="topk", topk=p.topk), device=dev)
    lg = lexical_graph(view, view.params.m, device=dev, k1=p.k1, b=p.b)
    if p.graph == "lexical":
        return lg
    key = f"both_k{p.k1}_b{p.b}"
    if key not in view.lexical.graphs:
        edges = [csr_edges(*g) for g in (view.graph(device=dev), lg)]
        view.lexical.graphs[key] = ops.symmetric_csr(torch.cat(edges, 1),
                                                      view.n_rows * N_GRAN)
    return view.lexical.graphs[key]


def lexical_graph(view, m: int = 30, skip_sessions: Optional[int] = None,
                  device: Optional[str] = None, k1: float = 1.5, b: float = 0.75) -> tuple:
    """Association graph over the view's nodes from *lexical* similarity.

    Node vectors are L2-normalised BM25 document weights (``idf · tfc`` of every term,
    corpus statistics per conversation and granularity; T = mean of the session's
    normalised turn vectors), over the conversation's terms; similarity = cosine; the
    top ``m`` earlier nodes are tested by the same 2-component GMM as the dense graph.
    Cached in ``view.lexical.graphs`` (cleared when sessions are added or removed).
    """
    from ..ops.bm25 import bm25_weights

    lex = view.lexical
    if lex is None:
        raise ValueError("this index has no lexical data: build it with lexical=True")
    skip = view.params.skip_sessions if skip_sessions is None else skip_sessions
    key = f"lexgmm_m{m}_s{skip}_k{k1}_b{b}"
    if key in lex.graphs:
        return lex.graphs[key]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    edges = []
    offs = view.conv_offsets.tolist()
    for c in range(view.n_conversations):
        nr = offs[c + 1] - offs[c]
        if nr == 0:
            continue
        slots = view.row_slot[offs[c]:offs[c + 1]]
        parts = []
        for g in CODES:
            doc_row, ids = expand_ranges(lex.doc_ptr[g], slots)
            parts.append((lex.docs[g].rows(ids), doc_row))
        terms = torch.unique(torch.cat([d.indices for d, _ in parts]))
        Vc = terms.numel()
        vecs = []
        for docs, doc_row in parts:
            local = torch.searchsorted(terms, docs.indices)
            W, col_key = bm25_weights(docs.indptr, local, docs.tf,
                                      torch.zeros(docs.n_rows, dtype=torch.long), Vc, k1=k1, b=b)
            d_i, col = W.indices()
            dense = torch.zeros(docs.n_rows, Vc, dtype=torch.float32)
            dense[d_i, col_key[col]] = W.values().float()
            dense = torch.nn.functional.normalize(dense, dim=1)
            per_row = torch.zeros(nr, Vc).index_add_(0, doc_row, dense)
            vecs.append(torch.nn.functional.normalize(per_row, dim=1))
        emb = torch.stack(vecs, 1).reshape(nr * N_GRAN, Vc).to(dev)
        sess = torch.arange(nr).repeat_interleave(N_GRAN).to(dev)
        e = ops.association_edges(emb, sess, m=max(1, min(m, nr * N_GRAN)),
                                  skip_sessions=skip, accept="gmm")
        edges.append(e.cpu() + offs[c] * N_GRAN)
    e = torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long)
    lex.graphs[key] = ops.symmetric_csr(e, view.n_rows * N_GRAN)
    return lex.graphs[key]


def graph_chunk(node_emb: Tensor, sizes: list[int], params: GraphParams,
                 device: str) -> tuple[Tensor, Tensor]:
    """Association graph of consecutive whole conversations (``sizes`` sessions each)."""
    dev = torch.device(device)
    node_emb = node_emb.to(dev)
    conv_of_row = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    sess = torch.arange(int(sum(sizes))).repeat_interleave(N_GRAN).to(dev)
    conv = conv_of_row.repeat_interleave(N_GRAN).to(dev)
    if params.rule not in ("gmm", "topk"):
        raise ValueError(f"unknown graph rule {params.rule!r} (use 'gmm' or 'topk')")
    gmm = params.rule == "gmm"
    ip, ix = ops.build_association_graph(node_emb, sess,
                                         m=candidates(params, node_emb.shape[0]),
                                         skip_sessions=params.skip_sessions,
                                         conversation_of_node=conv,
                                         accept="gmm" if gmm else "all")
    return ip.cpu(), ix.cpu()


def candidates(params: GraphParams, n_nodes: int) -> int:
    """Candidates per node of ``params`` (``m``, or ``topk`` for the top-k rule), capped
    by the ``n_nodes`` a conversation has: more could never be found, and a huge setting
    would otherwise size buffers by the setting instead of the data."""
    m = params.m if params.rule == "gmm" else params.topk
    return max(1, min(int(m), int(n_nodes)))


def _serial_map(fn, arg_lists):
    return (fn(*args) for args in arg_lists)


def build_graph(index, params: GraphParams, device: Optional[str] = None,
                max_nodes_per_chunk: int = 1 << 17, progress: Optional[bool] = None,
                mapper=None) -> tuple[Tensor, Tensor]:
    """Block-diagonal association graph of all conversations.

    Conversations are grouped into chunks of whole conversations (at most
    ``max_nodes_per_chunk`` nodes unless one conversation is larger) so memory stays
    bounded at LongMemEval-M scale; each chunk is independent, and ``mapper(fn,
    arg_lists)`` (default: in order, in this process; the Ray backend passes parallel
    tasks) must yield their results in order.
    """
    dev = str(torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    offs = index.conv_offsets.tolist()
    chunks = []
    c = 0
    while c < index.n_conversations:
        c_end = c + 1
        while (c_end < index.n_conversations
               and (offs[c_end + 1] - offs[c]) * N_GRAN <= max_nodes_per_chunk):
            c_end += 1
        chunks.append((c, c_end))
        c = c_end
    args = ((index.node_embeddings(torch.arange(offs[a], offs[b])),
             [offs[i + 1] - offs[i] for i in range(a, b)], params, dev) for a, b in chunks)
    bar = Progress(index.n_rows, f"graph ({params.key()})", unit="session", enabled=progress)
    parts = []
    for (a, b), part in zip(chunks, (mapper or _serial_map)(graph_chunk, args)):
        parts.append(part)
        bar.update(offs[b] - offs[a])
    bar.close()
    return join_csr(parts)
