"""The session store's chunks of one format-4 commit, read one at a time.

A commit stores the session store as chunks of consecutive slots (docs/index-format.md).
:class:`StoreChunks` names them (from the root: no chunk is read at open) and reads one
when asked (CRC-32 checked, then the store's checks: shapes, finite embeddings, digests,
pointers, UTF-8 texts); the memory keeps what it read (:mod:`memgas_gpu.memory.chunks`).
"""
from __future__ import annotations

import bisect
import json
import os
import struct

import torch

from ..ops.csr import join_pointers
from .pack import pack_name
from .validate import IndexFormatError, check_store

__all__ = ["StoreChunks", "store_of"]


class StoreChunks:
    """The chunks of one commit's store.

    Args:
        reader: a :class:`~memgas_gpu.storage.pack.PackReader` of the commit's packs.
        chunks: the root's ``chunks`` (``{"ref", "slots", "terms"}``), checked to follow
            one another.
        header: the root's fields the store's checks read (``dim``, ``tables``,
            ``lexical``).
        where: names the root in errors.
    """

    def __init__(self, reader, chunks: list, header: dict, where: str) -> None:
        self.reader = reader
        self.chunks = chunks
        self.header = header
        self.where = where
        self.starts = [c["slots"][0] for c in chunks]
        self.n_slots = chunks[-1]["slots"][1] if chunks else 0
        self.dim = int(header["dim"])
        self.reads = 0
        #: the commit's reference counts (a :class:`~memgas_gpu.storage.refs.RefTree`;
        #: None: a commit written before they were kept)
        self.refs = None
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
        pack, off, length = ref[0], ref[1], ref[2]
        self.reader.get([pack, 0, 0, 0], "the pack's header")
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
        """The chunk holding ``slot``."""
        return bisect.bisect_right(self.starts, slot) - 1

    def read(self, i: int) -> dict:
        """Chunk ``i``'s store tensors (:func:`store_of`; its own slots numbered from 0),
        read and checked."""
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
        return s


def store_of(parts: list) -> dict:
    """The session store's tensors of its chunks' tensors ``parts`` (in slot order),
    laid end to end (pointers rebased)."""
    from ..memory.texts import TextTable

    s: dict = {}
    s["gran"] = torch.cat([x["gran"] for x in parts]).float()
    dense = sorted(k for k in parts[0] if k.startswith("dense."))
    s["dense"] = {k[6:]: torch.cat([x[k] for x in parts]).float() for k in dense}
    s["digest"] = torch.cat([x["digest"] for x in parts]) if "digest" in parts[0] else None
    s["turn_ptr"] = (join_pointers([x["turn_ptr"] for x in parts]) if "turn_ptr" in parts[0]
                     else None)
    s["turns"] = torch.cat([x["turns"] for x in parts]).float() if "turns" in parts[0] \
        else None
    if "turn_text.bytes" in parts[0]:
        data = torch.cat([x["turn_text.bytes"] for x in parts])
        s["turn_text"] = TextTable(data if data.numel() else torch.zeros(1, dtype=torch.uint8),
                                   join_pointers([x["turn_text.offsets"] for x in parts]))
    else:
        s["turn_text"] = None
    groups = sorted({k.split(".")[1] for k in parts[0] if k.startswith("lexical.")})
    s["lexical"] = None
    if "vocab.bytes" in parts[0]:
        docs, ptr = {}, {}
        for g in groups:
            docs[g] = (join_pointers([x[f"lexical.{g}.indptr"] for x in parts]),
                       torch.cat([x[f"lexical.{g}.indices"] for x in parts]),
                       torch.cat([x[f"lexical.{g}.tf"] for x in parts]).float())
            ptr[g] = join_pointers([x[f"lexical.{g}.doc_ptr"] for x in parts])
        raw = torch.cat([x["vocab.bytes"] for x in parts])
        s["lexical"] = (docs, ptr, raw, join_pointers([x["vocab.offsets"] for x in parts]))
    return s
