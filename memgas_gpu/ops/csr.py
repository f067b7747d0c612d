"""CSR graphs as ``(indptr, indices)`` pairs: the one home of their small helpers.

A memory index keeps an association graph per conversation (*local*: nodes numbered
from 0) and joins the graphs of the conversations a read asks about into one
block-diagonal graph (nodes numbered conversation after conversation).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["empty_csr", "csr_edges", "join_csr", "split_csr", "join_pointers"]


def empty_csr(n_nodes: int) -> tuple[Tensor, Tensor]:
    """``n_nodes`` nodes and no edges."""
    return (torch.zeros(n_nodes + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long))


def csr_edges(indptr: Tensor, indices: Tensor) -> Tensor:
    """``[2, nnz]`` (source, target) of every edge."""
    src = torch.repeat_interleave(torch.arange(indptr.numel() - 1, device=indptr.device),
                                  indptr[1:] - indptr[:-1])
    return torch.stack([src, indices])


def join_csr(parts: Sequence[tuple]) -> tuple[Tensor, Tensor]:
    """Graphs of consecutive blocks → one block-diagonal graph (each block's nodes
    follow the previous block's)."""
    if not parts:
        return empty_csr(0)
    ptrs, idxs = [torch.zeros(1, dtype=torch.long)], []
    nnz = node = 0
    for ip, ix in parts:
        ptrs.append(ip[1:] + nnz)
        idxs.append(ix + node)
        nnz += int(ix.numel())
        node += int(ip.numel()) - 1
    return torch.cat(ptrs), torch.cat(idxs)


def split_csr(indptr: Tensor, indices: Tensor, node_offsets: Sequence[int]) -> list:
    """A block-diagonal graph → one graph per block (``node_offsets``: first node of each
    block, then the node count), nodes renumbered from 0."""
    out = []
    offs = list(node_offsets)
    for na, nb in zip(offs[:-1], offs[1:]):
        p0, p1 = int(indptr[na]), int(indptr[nb])
        out.append((indptr[na:nb + 1] - p0, indices[p0:p1] - na))
    return out


def join_pointers(ptrs: Sequence[Tensor]) -> Tensor:
    """Row pointers of several blocks laid end to end (each ``[n_i + 1]`` from 0): one
    ``[sum n_i + 1]`` int64 pointer, each block shifted by the entries before it."""
    out, base = [torch.zeros(1, dtype=torch.int64)], 0
    for p in ptrs:
        out.append(p[1:] + base)
        base += int(p[-1])
    return torch.cat(out)
