"""The session store of a memory opened on a folder, read a chunk at a time.

A format-4 commit stores the session store as chunks of consecutive slots
(docs/index-format.md).  :class:`ChunkedStore` names them (from the root: no chunk is
read at open); the first read that needs a slot reads its chunk (CRC-32 checked, then
the store's checks: shapes, finite embeddings, digests, pointers, UTF-8 texts) and
keeps it in the memory's resident set (:class:`~memgas_gpu.memory.lazy.Resident`),
from which the least recently used chunks are dropped.  :class:`LazyTables` is a store
snapshot over such chunks and the slots appended since (in RAM): reads take the rows
they need (:meth:`LazyTables.take`), never the whole table.

Only stores without lexical data are read this way: a store with BM25 documents
carries its vocabulary in its chunks, which every query needs, so it is read whole at
open (as before).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .lazy import owner_id
from .store import StoreTables
from .texts import TextTable

__all__ = ["ChunkedStore", "LazyTables", "concat_tables"]


class ChunkedStore:
    """The chunks of one commit's store (see the module docstring).

    Args:
        reader: a :class:`~memgas_gpu.storage.pack.PackReader` of the commit's packs.
        chunks: the root's ``chunks`` (``{"ref", "slots", "terms"}``), checked to follow
            one another.
        header: the root's fields the store's checks read (``dim``, ``tables``,
            ``lexical``).
        where: names the root in errors.
    """

    def __init__(self, reader, chunks: list, header: dict, where: str) -> None:
        from ..storage.validate import IndexFormatError

        self.reader = reader
        self.chunks = chunks
        self.header = header
        self.where = where
        self.starts = [c["slots"][0] for c in chunks]
        self.n_slots = chunks[-1]["slots"][1] if chunks else 0
        self.dim = int(header["dim"])
        self.resident = None  # set by the memory (its Resident)
        self.id = owner_id()  # its chunks' keys in the resident set
        self.reads = 0
        # the tables every chunk holds, from the first chunk's safetensors header
        keys = self._keys(chunks[0]["ref"]) if chunks else {"gran"}
        if "gran" not in keys:
            raise IndexFormatError(f"{where}: chunk 0: tensor 'gran': missing")
        self.keys = keys
        self.dense_names = sorted(k[6:] for k in keys if k.startswith("dense."))
        self.has_digest = "digest" in keys
        self.has_turn_ptr = "turn_ptr" in keys
        self.has_turns = "turns" in keys
        self.has_text = "turn_text.bytes" in keys

    def _keys(self, ref) -> set:
        """The tensor names of a chunk blob, from its safetensors header (its CRC-32 is
        checked when the chunk is read)."""
        from ..storage.pack import pack_name
        from ..storage.validate import IndexFormatError

        pack, off, length = ref[0], ref[1], ref[2]
        self.reader.get([pack, 0, 0, 0], "the pack's header")
        import os

        fd = self.reader.fds[pack]
        head = os.pread(fd, 8, off)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n < 0 or n + 8 > length or n > 1 << 26:
            raise IndexFormatError(f"{self.reader.folder / pack_name(pack)}: offset {off}: "
                                   "store chunk 0: not a safetensors blob")
        try:
            doc = json.loads(os.pread(fd, n, off + 8))
        except ValueError:
            raise IndexFormatError(f"{self.reader.folder / pack_name(pack)}: offset {off}: "
                                   "store chunk 0: not a safetensors blob") from None
        return {k for k in doc if k != "__metadata__"}

    def chunk_of(self, slot: int) -> int:
        import bisect

        return bisect.bisect_right(self.starts, slot) - 1

    def chunk(self, i: int, keep: bool = True) -> StoreTables:
        """The tables of chunk ``i`` (its own slots numbered from 0), read and checked
        when not resident."""
        key = (self.id, "chunk", i)
        res = self.resident
        got = res.get(key) if res is not None else None
        if got is not None:
            return got
        t = self._read(i)
        if res is not None and keep:
            t = res.put(key, t, _tables_bytes(t))
        return t

    def _read(self, i: int) -> StoreTables:
        from ..storage.commit import store_of
        from ..storage.validate import IndexFormatError, check_store

        c = self.chunks[i]
        x, _ = self.reader.tensors(c["ref"], f"store chunk {i}")
        self.reads += 1
        a, b = c["slots"]
        if set(x) != self.keys:
            raise IndexFormatError(f"{self.where}: chunk {i} holds other tables than chunk 0")
        gran = x.get("gran")
        if gran is None or gran.dim() != 3 or gran.shape[0] != b - a:
            raise IndexFormatError(f"{self.where}: chunk {i}: "
                                   f"{0 if gran is None else gran.shape[0]} slots, the root "
                                   f"says {[a, b]}")
        s = store_of([x])
        check_store(f"{self.where}: chunk {i}", s, self.header)
        return StoreTables(s["gran"], s["dense"], s["turns"], s["turn_ptr"], s["turn_text"],
                           None, None, None, 0, s["digest"], 0)

    def digests(self):
        """``(first slot, [n, 16] digests)`` of every chunk in order (each read, none
        kept beyond the resident set's bound)."""
        for i, c in enumerate(self.chunks):
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


def _cat_ptr(ptrs: list) -> Tensor:
    out, base = [torch.zeros(1, dtype=torch.int64)], 0
    for p in ptrs:
        out.append(p[1:] + base)
        base += int(p[-1])
    return torch.cat(out)


def concat_tables(parts: list, like: StoreTables) -> StoreTables:
    """Tables of several slot sets laid end to end (``like``: whose vocabulary and
    generation the result keeps)."""
    gran = torch.cat([p.gran for p in parts])
    dense = {k: torch.cat([p.dense[k] for p in parts]) for k in parts[0].dense}
    digest = torch.cat([p.digest for p in parts]) if parts[0].digest is not None else None
    turn_ptr = _cat_ptr([p.turn_ptr for p in parts]) if parts[0].turn_ptr is not None \
        else None
    turns = torch.cat([p.turns for p in parts]) if parts[0].turns is not None else None
    text = None
    if parts[0].turn_text is not None:
        datas, offs = [], []
        for p in parts:
            end = int(p.turn_text.offsets[-1])
            datas.append(p.turn_text.data[:end])
            offs.append(p.turn_text.offsets)
        data = torch.cat(datas)
        text = TextTable(data if data.numel() else torch.zeros(1, dtype=torch.uint8),
                         _cat_ptr(offs))
    return StoreTables(gran, dense, turns, turn_ptr, text, None, None, like.lexical_base,
                       like.n_terms, digest, like.generation)


@dataclass(frozen=True)
class LazyTables:
    """A store snapshot over a commit's chunks (slots ``[0, base.n_slots)``) and the
    slots appended since (``tail``, in RAM): see the module docstring.  Reads take
    rows (:meth:`take`); the whole-table attributes (``gran``, ``dense``, ...) read
    every chunk (a save, a compaction)."""

    base: ChunkedStore
    tail: StoreTables
    generation: int = 0

    @property
    def n_slots(self) -> int:
        return self.base.n_slots + self.tail.n_slots

    @property
    def dim(self) -> int:
        return self.base.dim

    @property
    def dense_names(self) -> list:
        return sorted(self.tail.dense)

    lexical_base = None
    lexical_docs = None
    lexical_ptr = None
    n_terms = 0
    lazy = True

    def take(self, slots: Tensor) -> StoreTables:
        """The tables of ``slots`` only, in that order (slot ``slots[i]`` becomes ``i``),
        read from the chunks that hold them."""
        slots = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
        n0 = self.base.n_slots
        parts, order = [], []
        at = 0
        if slots.numel():
            base = slots < n0
            idx = torch.nonzero(base).squeeze(1)
            if idx.numel():
                bs = slots[idx]
                chunk = torch.tensor([self.base.chunk_of(int(s)) for s in bs.tolist()])
                for c in torch.unique(chunk).tolist():
                    sel = idx[chunk == c]
                    local = slots[sel] - self.base.starts[c]
                    parts.append(self.base.chunk(c).take(local))
                    order.append(sel)
            tidx = torch.nonzero(~base).squeeze(1)
            if tidx.numel():
                parts.append(self.tail.take(slots[tidx] - n0))
                order.append(tidx)
        if not parts:
            return self.tail.take(torch.zeros(0, dtype=torch.int64))
        whole = concat_tables(parts, self.tail) if len(parts) > 1 else \
            StoreTables(parts[0].gran, parts[0].dense, parts[0].turns, parts[0].turn_ptr,
                        parts[0].turn_text, None, None, None, 0, parts[0].digest,
                        self.generation)
        at = torch.cat(order)
        if torch.equal(at, torch.arange(slots.numel())):
            return _with_generation(whole, self.generation)
        inv = torch.empty_like(at)
        inv[at] = torch.arange(at.numel())
        return _with_generation(whole.take(inv), self.generation)

    def _all(self) -> StoreTables:
        return self.take(torch.arange(self.n_slots))

    # whole tables (every chunk read): what a save or a compaction needs
    @property
    def gran(self) -> Tensor:
        return self._all().gran

    @property
    def dense(self) -> dict:
        return self._all().dense

    @property
    def digest(self) -> Optional[Tensor]:
        return self._all().digest

    @property
    def turns(self):
        return self._all().turns

    @property
    def turn_ptr(self):
        return self._all().turn_ptr

    @property
    def turn_text(self):
        return self._all().turn_text

    @property
    def concat(self):
        return self.dense.get("concat")

    def lexical_index(self):
        return None


def _with_generation(t: StoreTables, generation: int) -> StoreTables:
    from dataclasses import replace

    return t if t.generation == generation else replace(t, generation=generation)
