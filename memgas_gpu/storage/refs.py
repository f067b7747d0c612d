"""The reference counts of a format-4 commit's session store (docs/index-format.md,
"Reference counts").

Every live slot of the store (a stored session some conversation refers to) has an
entry ``[digest, slot, count]``: its content digest (32 hexadecimal digits;
:func:`~memgas_gpu.memory.store.session_digest`), its slot, and how many conversation
rows refer to it.  The entries are in a fixed tree of :data:`FANOUT`-way nodes over
:data:`N_LEAVES` leaves: an entry is in the leaf its *key* hashes to (the key is the
digest, or for a slot of unknown content, an all-zero digest, ``b"slot"`` and the slot
as 8 little-endian bytes; BLAKE2b of 8 bytes, little-endian, modulo :data:`N_LEAVES`),
the root lists the top level.  So the first write after a memory is opened reads the
counts of the slots it touches (a leaf each, and the nodes above it) instead of every
conversation, a session added again is found by its digest in one leaf, and a commit
rewrites the leaves that changed and the nodes above them, whatever the size of the
memory.  A slot no conversation refers to (garbage until a compaction) has no entry;
the root counts the entries (``live``).

:class:`RefTree` reads one commit's tree, each blob (CRC-32 checked) and each entry
checked the first time it is needed; :func:`write_tree` writes the changed leaves and
the nodes above them.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Callable, Optional

from .pack import pack_name
from .validate import IndexFormatError, want

__all__ = ["FANOUT", "LEVELS", "N_LEAVES", "RefTree", "ref_leaf", "write_tree",
           "check_refs_field"]

#: children of a node of the tree (the root's ``top`` list is the first level)
FANOUT = 16
#: levels of nodes, the root's ``top`` included, above the leaves
LEVELS = 4
#: leaves of the tree
N_LEAVES = FANOUT ** LEVELS
#: node and leaf blobs kept parsed by a reader
CACHE = 8192
_BITS = FANOUT.bit_length() - 1


def ref_leaf(digest: bytes, slot: int) -> int:
    """The leaf holding the entry of ``slot`` (content ``digest``; all zeros: unknown)."""
    key = digest if any(digest) else bytes(len(digest)) + b"slot" + slot.to_bytes(8, "little")
    h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return h % N_LEAVES


def _parent(level: int, leaf: int) -> tuple[int, int]:
    """The node (level, prefix) naming the child on ``leaf``'s path at ``level + 1``
    (level ``LEVELS``: the leaf itself), and the child's index in it."""
    shift = _BITS * (LEVELS - level)
    return leaf >> (shift + _BITS), (leaf >> shift) & (FANOUT - 1)


def _is_ref(x) -> bool:
    return isinstance(x, list) and len(x) == 4 and all(type(v) is int and v >= 0 for v in x)


def check_refs_field(where: str, field, n_slots: int) -> tuple[int, list]:
    """``(live, top)`` of a root's ``refs`` field, checked."""
    if not isinstance(field, dict) or set(field) != {"live", "top"}:
        raise IndexFormatError(f"{where}: field 'refs': expected the fields 'live' and 'top'")
    live = want(f"{where}: refs", field, "live", int)
    top = want(f"{where}: refs", field, "top", list)
    if not 0 <= live <= n_slots:
        raise IndexFormatError(f"{where}: refs: field 'live': {live} live slots of a store of "
                               f"{n_slots}")
    if len(top) != FANOUT or not all(r is None or _is_ref(r) for r in top):
        raise IndexFormatError(f"{where}: refs: field 'top': expected {FANOUT} blob "
                               "references or nulls")
    return live, list(top)


class _Cache:
    """Parsed node and leaf blobs by ref (a ref's bytes never change), least recently
    used dropped past :data:`CACHE`."""

    def __init__(self) -> None:
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, ref):
        with self.lock:
            got = self.items.get(tuple(ref))
            if got is not None:
                self.items.move_to_end(tuple(ref))
            return got

    def put(self, ref, value) -> None:
        with self.lock:
            self.items[tuple(ref)] = value
            while len(self.items) > CACHE:
                self.items.popitem(last=False)


class RefTree:
    """The reference counts of one commit (see the module docstring).

    Args:
        reader: a :class:`~memgas_gpu.storage.pack.PackReader` of the commit's packs.
        top: the root's ``refs.top``; live: its ``refs.live``.
        n_slots: slots of the commit's store (an entry's slot is checked against it).
        where: names the root in errors.
        cache: parsed blobs shared with the trees of later commits of one writer.
        owns: close ``reader`` with the tree (a writer's own reader; a later commit's
            tree that takes the reader takes this over: :meth:`hand_over`).
    """

    def __init__(self, reader, top: list, live: int, n_slots: int, where: str,
                 cache: Optional[_Cache] = None, owns: bool = False) -> None:
        self.owns = owns
        self.reader = reader
        self.top = list(top)
        self.live = live
        self.n_slots = n_slots
        self.where = where
        self.cache = cache if cache is not None else _Cache()
        self.reads = 0

    def hand_over(self) -> bool:
        """Whether this tree owned its reader, which it no longer does (a later commit's
        tree takes it)."""
        owned, self.owns = self.owns, False
        return owned

    def close(self) -> None:
        if self.owns:
            self.owns = False
            self.reader.close()

    def __del__(self) -> None:  # a writer's reader: its packs' files released
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _node(self, level: int, prefix: int) -> list:
        """The children of node ``(level, prefix)`` (level 1: the root's ``top``)."""
        if level == 1:
            return self.top
        parent, i = _parent(level - 1, prefix << (_BITS * (LEVELS - level + 1)))
        ref = self._node(level - 1, parent)[i]
        if ref is None:
            return [None] * FANOUT
        return self._read(ref, f"reference node {level}.{prefix}", "refs", self._check_node)

    def _read(self, ref, what: str, key: str, check):
        """The blob ``ref`` (a JSON object of the one field ``key``) as ``check(at,
        value)`` makes it, read (CRC-32) and checked once, then kept parsed."""
        got = self.cache.get(ref)
        if got is not None:
            return got
        doc = self.reader.json(ref, what)
        self.reads += 1
        at = f"{self.reader.folder / pack_name(ref[0])}: offset {ref[1]}: {what}"
        value = want(at, doc, key, list)
        if set(doc) != {key}:
            raise IndexFormatError(f"{at}: expected the one field {key!r}")
        got = check(at, value)
        self.cache.put(ref, got)
        return got

    @staticmethod
    def _check_node(at: str, kids: list) -> list:
        if len(kids) != FANOUT or not all(r is None or _is_ref(r) for r in kids):
            raise IndexFormatError(f"{at}: expected {{'refs': [{FANOUT} blob references or "
                                   "nulls]}")
        return kids

    def leaf_ref(self, leaf: int) -> Optional[list]:
        parent, i = _parent(LEVELS, leaf)
        return self._node(LEVELS, parent)[i]

    def node_refs(self, level: int, prefix: int) -> list:
        """A copy of the children of node ``(level, prefix)``."""
        return list(self._node(level, prefix))

    def leaf(self, leaf: int) -> dict:
        """``{slot: (digest, count)}`` of one leaf, read and checked once."""
        ref = self.leaf_ref(leaf)
        if ref is None:
            return {}
        return self._read(ref, f"reference leaf {leaf}", "entries",
                          lambda at, entries: self._check_leaf(at, entries, leaf))

    def _check_leaf(self, at: str, entries: list, leaf: int) -> dict:
        if not entries:
            raise IndexFormatError(f"{at}: no entry (an empty leaf is left out)")
        out: dict = {}
        for e in entries:
            if not (isinstance(e, list) and len(e) == 3 and isinstance(e[0], str)
                    and len(e[0]) == 32 and type(e[1]) is int and type(e[2]) is int):
                raise IndexFormatError(f"{at}: an entry is not [digest, slot, count]")
            try:
                digest = bytes.fromhex(e[0])
            except ValueError:
                raise IndexFormatError(f"{at}: an entry's digest is not hexadecimal") from None
            slot, count = e[1], e[2]
            if not 0 <= slot < self.n_slots or count < 1:
                raise IndexFormatError(f"{at}: slot {slot} with {count} references (a store of "
                                       f"{self.n_slots} slots; an entry counts at least 1)")
            if ref_leaf(digest, slot) != leaf or slot in out:
                raise IndexFormatError(f"{at}: slot {slot}'s entry does not belong in it, or "
                                       "is there twice")
            out[slot] = (digest, count)
        return out

    def disagrees(self, slot: int) -> IndexFormatError:
        """The error of a write that finds ``slot`` referred to by a conversation while
        these counts say by none."""
        return IndexFormatError(f"{self.where}: slot {slot} is referred to by a "
                                "conversation, but the reference counts say by none")

    def count(self, slot: int, digest: bytes) -> int:
        """How many rows referred to ``slot`` (content ``digest``) in this commit."""
        got = self.leaf(ref_leaf(digest, slot)).get(slot)
        return got[1] if got is not None else 0

    def leaf_of_digest(self, digest: bytes) -> dict:
        """The leaf (``{slot: (digest, count)}``) holding the slots of content
        ``digest`` (not all zeros)."""
        return self.leaf(ref_leaf(digest, 0))

    def counts(self) -> dict:
        """``{slot: count}`` of every live slot (every leaf read), checked against the
        root's ``live``."""
        out: dict = {}
        prefixes = [0]  # the nodes of one level holding some entry
        for level in range(1, LEVELS + 1):
            prefixes = [p * FANOUT + i for p in prefixes
                        for i, ref in enumerate(self._node(level, p)) if ref is not None]
        for leaf in prefixes:
            out.update((s, c) for s, (_, c) in self.leaf(leaf).items())
        if len(out) != self.live:
            raise IndexFormatError(f"{self.where}: refs: {len(out)} entries, the root says "
                                   f"{self.live}")
        return out


def write_tree(w, changed: dict, current: Callable[[int, int], list],
               top: list, put_cache: list) -> list:
    """Write the leaves ``changed`` (``{leaf: {slot: (digest, count)}}``, an empty one
    removed) and the nodes above them; ``current(level, prefix)``: a node's children
    in the commit written over (``[None] * FANOUT`` for a full commit, whose ``top`` is
    all None); returns the new ``top``.  The superseded blobs are dropped from their
    packs' live bytes; ``put_cache`` gets ``(ref, parsed)`` of each blob written."""
    kids: dict = {}  # (level, prefix) -> new children, levels 1 .. LEVELS

    def node(level: int, prefix: int) -> list:
        got = kids.get((level, prefix))
        if got is None:
            got = kids[(level, prefix)] = list(top) if level == 1 else current(level, prefix)
        return got

    for leaf in sorted(changed):
        parent, i = _parent(LEVELS, leaf)
        children = node(LEVELS, parent)
        w.drop(children[i])
        entries = changed[leaf]
        if entries:
            body = [[d.hex(), s, c] for s, (d, c) in sorted(entries.items())]
            children[i] = w.put(_json({"entries": body}))
            put_cache.append((children[i], dict(entries)))
        else:
            children[i] = None
    for level in range(LEVELS, 1, -1):
        for prefix in sorted(p for (lv, p) in list(kids) if lv == level):
            children = kids[(level, prefix)]
            parent, i = _parent(level - 1, prefix << (_BITS * (LEVELS - level + 1)))
            up = node(level - 1, parent)
            w.drop(up[i])
            if any(r is not None for r in children):
                up[i] = w.put(_json({"refs": children}))
                put_cache.append((up[i], list(children)))
            else:
                up[i] = None
    return node(1, 0) if (1, 0) in kids else list(top)


def _json(value) -> bytes:
    from .pack import json_blob

    return json_blob(value)
