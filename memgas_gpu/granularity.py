"""The granularities of a memory: one home for their names, codes and node layout.

MemGAS remembers every session at four granularities (docs/algorithm.md, "Write
path"): the whole session text **S**, its turns **T**, a summary **U** and keywords
**K**.  In a :class:`~memgas_gpu.retrieve.MemoryIndex` each session row owns one graph
node per granularity, interleaved: node ``G * row + g``.  Everything that needs the
number, the order or the codes of the granularities takes them from here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Granularity", "GRANULARITIES", "N_GRAN", "CODES", "granularity",
           "node_ids", "expand_ranges"]


@dataclass(frozen=True)
class Granularity:
    """One granularity: ``name`` (e.g. ``"summary"``), one-letter ``code`` (``"U"``) and
    its position ``index`` among the interleaved nodes of a session row."""

    name: str
    code: str
    index: int
    description: str


GRANULARITIES = (
    Granularity("session", "S", 0, "the session text: its turns joined by newlines"),
    Granularity("turn", "T", 1, "the turns (pairs of messages); embedding = mean of turns"),
    Granularity("summary", "U", 2, "a summary of the session (offline, dataset, file or LLM)"),
    Granularity("keyword", "K", 3, "keywords of the session (offline, file or LLM)"),
)
#: number of granularities (graph nodes per session row)
N_GRAN = len(GRANULARITIES)
#: one-letter codes in node order: ``"STUK"``
CODES = "".join(g.code for g in GRANULARITIES)


def granularity(key) -> Granularity:
    """The granularity named ``key``: its name, code or index."""
    for g in GRANULARITIES:
        if key in (g.name, g.code, g.index):
            return g
    raise KeyError(f"unknown granularity {key!r}; choose from "
                   f"{', '.join(g.name for g in GRANULARITIES)} (codes {CODES})")


def node_ids(rows: Tensor, g=None) -> Tensor:
    """Graph node ids of session ``rows``: ``[len(rows), N_GRAN]`` (``g=None``) or
    ``[len(rows)]`` for one granularity ``g`` (name, code or index)."""
    rows = rows.to(torch.int64)
    if g is None:
        return rows[:, None] * N_GRAN + torch.arange(N_GRAN, device=rows.device)
    return rows * N_GRAN + granularity(g).index


def expand_ranges(ptr: Tensor, which: Tensor) -> tuple[Tensor, Tensor]:
    """Flatten the CSR ranges ``ptr[w]:ptr[w+1]`` of every ``w`` in ``which``.

    The idiom behind every "documents of these sessions" lookup (turns of a session,
    lexical documents of a granularity).

    Returns:
        ``(owner, ids)``: for each flattened element, its position in ``which`` and its
        id in ``[ptr[0], ptr[-1])``; ranges keep their order.
    """
    which = which.to(torch.int64)
    start = ptr[which]
    cnt = ptr[which + 1] - start
    owner = torch.repeat_interleave(torch.arange(which.numel(), device=ptr.device), cnt)
    first = torch.cumsum(cnt, 0) - cnt
    ids = start[owner] + torch.arange(owner.numel(), device=ptr.device) - first[owner]
    return owner, ids
