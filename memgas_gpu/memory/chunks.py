"""The session store of a memory opened on a folder, read a chunk at a time.

A format-4 commit stores the session store as chunks of consecutive slots
(docs/index-format.md).  :class:`ChunkedStore` names them (from the root: no chunk is
read at open); the first read that needs a slot reads its chunk (CRC-32 checked, then
the store's checks: shapes, finite embeddings, digests, pointers, UTF-8 texts) and
keeps it in the memory's resident set (:class:`~memgas_gpu.memory.lazy.Resident`),
from which the least recently used chunks are dropped
(:class:`~memgas_gpu.storage.chunks.StoreChunks` reads and checks them).
:class:`~memgas_gpu.memory.store.LazyTables` is a store snapshot over such chunks and
the slots appended since (in RAM): reads take the rows they need, never the whole
table.

Only stores without lexical data are read this way: a store with BM25 documents
carries its vocabulary in its chunks, which every query needs, so it is read whole at
open (as before).
"""
from __future__ import annotations

from .lazy import owner_id
from .store import StoreTables

__all__ = ["ChunkedStore"]


class ChunkedStore:
    """The chunks of one commit's store (a
    :class:`~memgas_gpu.storage.chunks.StoreChunks`, ``source``) as the memory reads
    them: each chunk's tables kept in the memory's resident set once read."""

    def __init__(self, source) -> None:
        self.source = source
        self.resident = None  # set by the memory (its Resident)
        self.id = owner_id()  # its chunks' keys in the resident set
        self.starts = source.starts
        self.n_slots = source.n_slots
        self.dim = source.dim
        self.dense_names = source.dense_names
        self.has_turn_ptr = source.has_turn_ptr
        self.has_turns = source.has_turns
        self.has_text = source.has_text
        self.chunk_of = source.chunk_of
        self.refs = source.refs

    @property
    def reads(self) -> int:
        """Chunks read from the folder so far."""
        return self.source.reads

    def chunk(self, i: int, keep: bool = True) -> StoreTables:
        """The tables of chunk ``i`` (its own slots numbered from 0), read and checked
        when not resident."""
        key = (self.id, "chunk", i)
        res = self.resident
        got = res.get(key) if res is not None else None
        if got is not None:
            return got
        s = self.source.read(i)
        t = StoreTables(s["gran"], s["dense"], s["turns"], s["turn_ptr"], s["turn_text"],
                        None, None, None, 0, s["digest"], 0)
        if res is not None and keep:
            t = res.put(key, t, _tables_bytes(t))
        return t

    def digests(self):
        """``(first slot, [n, 16] digests)`` of every chunk in order (each read, none
        kept beyond the resident set's bound)."""
        for i, c in enumerate(self.source.chunks):
            t = self.chunk(i, keep=False)
            yield c["slots"][0], t.digest


def _tables_bytes(t: StoreTables) -> int:
    n = 0
    for x in (t.gran, t.turns, t.turn_ptr, t.digest, *t.dense.values()):
        if x is not None:
            n += x.numel() * x.element_size()
    if t.turn_text is not None:
        n += t.turn_text.data.numel() + 8 * t.turn_text.offsets.numel()
    return n + 1024
