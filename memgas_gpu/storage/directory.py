"""The conversations of one format-4 commit, read lazily (docs/index-format.md, "The
directory").

Opening a folder reads the pointer, the root and the store; the 64 first-level pages
are named by the root, each of their 64 leaves is read the first time a conversation
that hashes to it is looked up, and a conversation's segment blob the first time its
content is needed.  Listing every conversation reads every leaf, and no segment.

Every blob read here gets the checks a full read gives it: its CRC-32, the leaf's
entries (each in the leaf its id hashes to, no id twice), the segment's fields against
its entry and the store (:func:`~memgas_gpu.storage.validate.check_segments`).  What
cannot be checked before everything is read (the number of conversations the root
records) is checked when everything is: a full listing.

The packs the commit names are opened when the directory is made, so a writer's later
commit that removes a pack (a full commit) leaves this snapshot readable through the
open files (as a Lucene reader keeps the segment files of its commit point).
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Optional

from .pack import PackReader, pack_name
from .validate import IndexFormatError, check_segments, want

__all__ = ["Directory", "LEAF_CACHE", "PAGES", "LEAVES", "leaf_of"]

#: directory leaves kept parsed (each about n / 4096 entries; a lookup that misses
#: reads one small blob)
LEAF_CACHE = 1024


#: first-level pages of the directory, and leaves of each page
PAGES = LEAVES = 64


def leaf_of(cid: str) -> tuple[int, int]:
    """The (page, leaf) of a conversation id: by its BLAKE2b hash."""
    h = int.from_bytes(hashlib.blake2b(cid.encode("utf-8", "surrogatepass"),
                                       digest_size=8).digest(), "little")
    return (h >> 6) % PAGES, h % LEAVES


class Directory:
    """The conversations of one commit (see the module docstring).

    Args:
        folder: the memory's folder.
        root: the commit's root (checked by the reader: ``directory``, ``packs``).
        where: names the root in errors.
        n_slots: slots of the commit's store (a segment's slots are checked against it).
        graphs: the graph settings every segment holds.
    """

    def __init__(self, folder: Path, root: dict, where: str, n_slots: int,
                 graphs: list) -> None:

        self.folder = Path(folder)
        self.where = where
        self.n_slots = n_slots
        self.graphs = list(graphs)
        directory = root["directory"]
        pages = want(f"{where}: directory", directory, "pages", list)
        if len(pages) != PAGES:
            raise IndexFormatError(f"{where}: directory: {len(pages)} pages, not {PAGES}")
        self.pages = list(pages)
        self.count = want(f"{where}: directory", directory, "conversations", int)
        self.next_ordinal = int(directory.get("next_ordinal", self.count))
        self.reader = PackReader(self.folder)
        self._lock = threading.Lock()
        self._page_leaves: dict = {}
        self._leaves: OrderedDict = OrderedDict()
        self.reads = {"leaves": 0, "segments": 0}
        for k in sorted(int(p) for p in root["packs"]):
            try:  # every pack of the commit, open from now on
                self.reader.get([k, 0, 0, 0], "the pack's header")
            except FileNotFoundError:
                raise
            except IndexFormatError:
                raise

    def close(self) -> None:
        self.reader.close()

    def __del__(self) -> None:  # the packs' files are released with the last reader
        try:
            self.reader.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ the directory
    def page_leaves(self, page: int) -> list:
        """The 64 leaf refs of first-level ``page`` (None: no conversation there)."""

        with self._lock:
            got = self._page_leaves.get(page)
        if got is not None:
            return got
        ref = self.pages[page]
        if ref is None:
            got = [None] * LEAVES
        else:
            doc = self.reader.json(ref, f"directory page {page}")
            got = want(f"{self.where}: page {page}", doc, "leaves", list)
            if len(got) != LEAVES:
                raise IndexFormatError(f"{self.where}: directory page {page}: {len(got)} "
                                       "leaves")
        with self._lock:
            self._page_leaves[page] = got
        return got

    def leaf(self, key: tuple) -> dict:
        """``{id: entry}`` of one leaf (``(page, leaf)``), read and checked once, kept
        among the last :data:`LEAF_CACHE` read."""
        with self._lock:
            got = self._leaves.get(key)
            if got is not None:
                self._leaves.move_to_end(key)
                return got
        ref = self.page_leaves(key[0])[key[1]]
        got = {} if ref is None else self._read_leaf(key, ref)
        with self._lock:
            self._leaves[key] = got
            while len(self._leaves) > LEAF_CACHE:
                self._leaves.popitem(last=False)
        return got

    def _read_leaf(self, key: tuple, ref) -> dict:

        i, j = key
        doc = self.reader.json(ref, f"directory leaf {i}.{j}")
        self.reads["leaves"] += 1
        got = want(f"{self.where}: leaf {i}.{j}", doc, "entries", list)
        mine: dict = {}
        for e in got:
            if not (isinstance(e, list) and len(e) == 7 and isinstance(e[0], str)
                    and all(type(x) is int and x >= 0 for x in e[1:])):
                raise IndexFormatError(f"{self.where}: leaf {i}.{j}: an entry is not [id, "
                                       "ordinal, pack, offset, length, crc32, sessions]")
            if leaf_of(e[0]) != (i, j):
                raise IndexFormatError(f"{self.where}: leaf {i}.{j}: conversation "
                                       f"{e[0][:80]!r} does not belong in it")
            if e[0] in mine:
                raise IndexFormatError(f"{self.where}: field 'conversations': conversation "
                                       f"id {e[0][:80]!r} appears twice")
            mine[e[0]] = e
        return mine

    def entry(self, cid: str) -> Optional[list]:
        """The directory entry ``[id, ordinal, pack, offset, length, crc32, sessions]`` of
        a conversation, or None (one leaf read at most)."""
        return self.leaf(leaf_of(cid)).get(cid)

    def entries(self) -> list:
        """Every entry, in the memory's order (every leaf read, no segment)."""

        out = []
        for i in range(PAGES):
            if self.pages[i] is None:
                continue
            refs = self.page_leaves(i)
            for j in range(LEAVES):
                if refs[j] is not None:
                    out.extend(self.leaf((i, j)).values())
        if len(out) != self.count:
            raise IndexFormatError(f"{self.where}: the directory lists {len(out)} "
                                   f"conversations, the root says {self.count}")
        ords = [e[1] for e in out]
        if len(set(ords)) != len(ords):
            raise IndexFormatError(f"{self.where}: two conversations of the directory have "
                                   "one ordinal")
        out.sort(key=lambda e: e[1])
        return out

    # ------------------------------------------------------------------ segments
    def load(self, entry: list) -> tuple:
        """The segment of a directory entry, read and checked: ``(meta, slots, days,
        graphs)`` as :class:`~memgas_gpu.storage.commit.Parts` holds them."""
        cid = entry[0]
        x, meta = self.reader.tensors(entry[2:6], f"conversation {cid[:80]!r}")
        self.reads["segments"] += 1
        graphs = {k[6:-7]: (x[k], x.get(k[:-7] + ".indices")) for k in x
                  if k.startswith("graph.") and k.endswith(".indptr")}
        if meta.get("id") != cid or x.get("slots") is None or x["slots"].numel() != entry[6]:
            raise IndexFormatError(f"{self.where}: conversation {cid[:80]!r}: its segment "
                                   "does not match its directory entry")
        part = (meta, x["slots"], x.get("days"), graphs)
        where = f"{self.folder / pack_name(entry[2])}: offset {entry[3]}"
        check_segments(where, [part], self.n_slots, self.graphs)
        return part
