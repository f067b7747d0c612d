"""Conversations read when they are first needed, and the bound on what stays resident.

A memory opened on a folder (``MemoryIndex.open``, ``open(readonly=True)``,
``MemoryIndex.load``) reads the commit's root and store; its conversations stay in the
folder's directory (:class:`~memgas_gpu.storage.directory.Directory`) until a search,
a write or a listing of their content needs them.  :class:`Base` is that directory as
the memory's states see it: each conversation's segment read once, given a version
that stays the same whenever it is read again (so views cached by version stay valid
across evictions), and kept in the memory's :class:`Resident` set.

:class:`Resident` keeps the segments read from a base, least recently used first, and
drops the oldest once they hold more than ``max_resident_bytes`` (their tensors and a
fixed estimate of their Python objects): a dropped segment is read again from its file
on its next use.  Only segments read from a base are dropped: what was written since
the memory was opened lives in the states (Lucene's readers keep what they have not
flushed the same way), and a view or a read that holds a segment keeps it alive until
it is done with it.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Optional

import torch

from .meta import ConversationMeta
from .segments import Segment

__all__ = ["Base", "Resident", "MAX_RESIDENT_BYTES", "segment_bytes", "owner_id"]

#: default bound on the bytes of segments read from a folder that a memory keeps
MAX_RESIDENT_BYTES = 256 << 20
#: estimate of one segment's Python objects (meta, lists, dicts, tensor headers)
SEGMENT_OVERHEAD = 2048

_OWNERS = itertools.count(1)


def owner_id() -> int:
    """A number naming one base or chunked store in the resident sets: the first
    element of its keys, never given twice in a process (``id()`` of a collected
    object is given again, and its entries would be read as the new object's)."""
    return next(_OWNERS)


def segment_bytes(seg: Segment) -> int:
    """What a segment holds in RAM: its tensors' bytes and a fixed estimate of its
    Python objects and strings."""
    n = seg.slots.numel() * seg.slots.element_size() + seg.days.numel() * 8
    for ip, ix in seg.graphs.values():
        n += ip.numel() * ip.element_size() + ix.numel() * ix.element_size()
    meta = seg.meta
    n += sum(len(x) for x in meta.session_ids) + sum(len(x) for x in meta.session_dates)
    return n + SEGMENT_OVERHEAD + 64 * len(meta.session_ids)


class Resident:
    """The segments read from folders that a memory keeps: at most ``max_bytes``,
    least recently used dropped first (thread-safe)."""

    def __init__(self, max_bytes: int = MAX_RESIDENT_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_resident_bytes must be an integer >= 0, got "
                             f"{max_bytes!r}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict = OrderedDict()  # key -> (segment, bytes)
        self.bytes = 0
        self.loads = 0
        self.evictions = 0

    def get(self, key) -> Optional[Segment]:
        with self._lock:
            got = self._items.get(key)
            if got is None:
                return None
            self._items.move_to_end(key)
            return got[0]

    def put(self, key, seg, size: Optional[int] = None):
        """Keep ``seg`` (a segment, or a store chunk of ``size`` bytes), or the one
        another thread kept under ``key`` meanwhile."""
        size = segment_bytes(seg) if size is None else size
        with self._lock:
            self.loads += 1
            got = self._items.get(key)
            if got is not None:
                self._items.move_to_end(key)
                return got[0]
            self._items[key] = (seg, size)
            self.bytes += size
            while self.bytes > self.max_bytes and self._items:
                _, (_, b) = self._items.popitem(last=False)
                self.bytes -= b
                self.evictions += 1
            return seg

    def drop(self, prefix) -> None:
        """Forget every segment of one base, or every chunk of one store (a memory that
        read a newer commit)."""
        with self._lock:
            for k in [k for k in self._items if k[0] == prefix]:
                self.bytes -= self._items.pop(k)[1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def stats(self) -> dict:
        with self._lock:
            return {"resident_bytes": self.bytes, "resident_segments": len(self._items),
                    "max_resident_bytes": self.max_bytes, "segment_loads": self.loads,
                    "evictions": self.evictions}


class Base:
    """The conversations of one commit as a memory's states see them (see the module
    docstring).

    Args:
        directory: the commit's :class:`~memgas_gpu.storage.directory.Directory`.
        resident: the memory's :class:`Resident` set.
    """

    def __init__(self, directory, resident: Resident) -> None:
        self.directory = directory
        self.resident = resident
        self.id = owner_id()

    @property
    def count(self) -> int:
        return self.directory.count

    @property
    def next_ordinal(self) -> int:
        return self.directory.next_ordinal

    def ordinal(self, cid) -> Optional[int]:
        if not isinstance(cid, str):
            return None
        e = self.directory.entry(cid)
        return e[1] if e is not None else None

    def version_of(self, cid: str) -> int:
        """The version of a conversation of the base: the same every time it is read
        (negative, so never one of :func:`~memgas_gpu.memory.segments.next_version`'s;
        made of the base's number and the conversation's ordinal)."""
        return -((self.id << 40) + self.directory.entry(cid)[1] + 1)

    def entries(self) -> list:
        return self.directory.entries()

    def segment(self, cid: str, keep: bool = True) -> Optional[Segment]:
        """The segment of a conversation of the base (read and checked when it is not
        resident; ``keep``: made resident), or None."""
        key = (self.id, cid)
        got = self.resident.get(key)
        if got is not None:
            return got
        e = self.directory.entry(cid)
        if e is None:
            return None
        meta, slots, days, graphs = self.directory.load(e)
        seg = Segment(ConversationMeta(meta["id"], list(meta["session_ids"]),
                                       list(meta["session_dates"]),
                                       meta.get("session_metadata")),
                      slots.to(torch.int64), dict(graphs), version=-((self.id << 40) + e[1] + 1),
                      days=days.to(torch.float64) if days is not None else None)
        return self.resident.put(key, seg) if keep else seg
