"""Queries over the contiguous blocks of their conversations, padded to one width.

Many conversations are stored one after another: conversation ``c`` owns rows
``offsets[c]:offsets[c+1]`` of a table (sessions of a memory index, events or topics of
a GAM memory).  A batch of queries, query ``q`` asking conversation ``conv[q]``, is laid
out ``[Q, N_max]`` (``N_max`` the largest queried block): position ``j`` of query ``q`` is
row ``offsets[conv[q]] + j``, real while ``j < n[q]``.  Every read path gathers its
per-query scores through this one layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Layout", "query_layout"]


@dataclass
class Layout:
    """Where each query's rows are.

    Attributes:
        conv: ``[Q]`` int64 block (conversation) of each query.
        start: ``[Q]`` first row of its block.
        n: ``[Q]`` rows in its block.
        valid: ``[Q, N_max]`` bool, ``j < n[q]``.
        rows: ``[Q, N_max]`` int64 row ``start[q] + j`` (0 for padding).
    """

    conv: Tensor
    start: Tensor
    n: Tensor
    valid: Tensor
    rows: Tensor

    @property
    def n_max(self) -> int:
        return int(self.rows.shape[1])


def query_layout(offsets: Tensor, q_conv: Tensor) -> Layout:
    """The :class:`Layout` of queries of blocks ``q_conv``.

    Args:
        offsets: ``[C+1]`` int64, block ``c`` owns rows ``offsets[c]:offsets[c+1]``.
        q_conv: ``[Q]`` block of each query (any integer dtype).

    Returns:
        A :class:`Layout` on ``offsets``'s device (``N_max = 0`` for no queries).
    """
    conv = q_conv.to(device=offsets.device, dtype=torch.int64)
    start = offsets[conv]
    n = offsets[conv + 1] - start
    n_max = int(n.max()) if n.numel() else 0
    pos = torch.arange(n_max, device=offsets.device)
    valid = pos[None, :] < n[:, None]
    rows = torch.where(valid, start[:, None] + pos, torch.zeros_like(valid, dtype=torch.long))
    return Layout(conv, start, n, valid, rows)
