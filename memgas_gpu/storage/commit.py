"""The commit format of a memory's folder (format 4): what a checkpoint of an opened
memory writes and what ``save`` writes, read back by every reader
(docs/index-format.md).

A folder::

    DIR/manifest.json      the pointer: {"format", "version": 4, "commit", "root"}
    DIR/.lock              the writer's lock (:mod:`.lock`)
    DIR/data/00000001.pack append-only files of blobs (a commit appends to the last one)
    DIR/wal/               the write-ahead log (:mod:`.log`): records after the commit

A **blob** is a run of bytes in a pack, named by a *ref* ``[pack, offset, length,
crc32]``; a commit's blobs are never changed once written, and a reader checks each
blob's CRC-32.  The **root** (a JSON blob the pointer names) holds the settings, the
log sequence number (LSN) the commit covers, the store's last chunks (the earlier
ones in *chunk pages* of 16 entries, each written once and naming the page before it,
so the root does not grow with the store), the questions' blob,
and the two-level **directory** of conversations: 64 first-level pages of 64 leaves
each, a conversation in the leaf its id hashes to (BLAKE2b), each leaf listing its
conversations' entries ``[id, ordinal, pack, offset, length, crc32, sessions]`` (the
ordinal keeps the memory's order).  A conversation's **segment** is one safetensors
blob (session ids, dates and metadata; slots, parsed dates, association graphs); a
**chunk** of the session store holds the slots ``[a, b)`` (embeddings, digests, turn
embeddings and texts, lexical documents and the vocabulary terms added with them).

A **commit** after some writes appends to the last pack: the changed conversations'
segments, their leaves and first-level pages, a chunk of the new slots (chunks merged
eight at a time, so there are few and each slot is rewritten a logarithmic number of
times), the root; fsyncs the pack; then replaces the pointer (a temporary file,
fsync'd, renamed, the folder fsync'd).  So a commit writes what changed plus a bounded
path of pages, whatever the number of conversations.  A *full* commit (``save``, a
compaction, a folder converted, or when superseded blobs outweigh the live ones) writes
everything to a new pack, and the packs it replaced are removed once the pointer names
it.  A crash leaves the previous commit current: bytes past the pointer's commit are
cut off by the next writer.
"""
from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .._io import json_loads
from . import files
from .pack import (DATA, MAX_JSON_BYTES, PACK_HEADER_BYTES, PackReader, PackWriter,
                   json_blob, pack_files, pack_name, tensor_blob)
from .chunks import StoreChunks, store_of
from .directory import LEAVES, PAGES, leaf_of
from ..memory.store import DIGEST_BYTES
from .refs import FANOUT, RefTree, check_refs_field, ref_leaf, write_tree
from .validate import IndexFormatError, want

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "POINTER", "DATA", "WAL", "Written",
           "CommitInput", "Parts", "write_commit", "read_commit", "read_pointer",
           "IndexFormatError", "cut_uncommitted", "vocab_tensors"]

FORMAT_NAME = "memgas_gpu.index"
#: the folder format this version writes
FORMAT_VERSION = 4
POINTER = "manifest.json"
WAL = "wal"
#: store chunks of one size class merged at once (each slot rewritten log_8 times)
CHUNK_FANIN = 8
#: slots per chunk a full commit writes at most (bounds the memory a write needs)
CHUNK_SLOTS = 1 << 15
#: about the bytes of one store chunk: a full commit cuts the store into chunks of this
#: size and merges stop there, so that a memory opened on the folder reads (and checks)
#: about this much the first time it needs a slot of a chunk
CHUNK_BYTES = 2 << 20
#: store chunk entries per chunk page: the root lists the last chunks (fewer than
#: CHUNK_PAGE + CHUNK_FANIN), full pages of the earlier ones are written once, each
#: naming the page before it, so a commit's root does not grow with the store
CHUNK_PAGE = 16
#: the most chunk pages a root may count (a hostile count is refused before any read)
MAX_CHUNK_PAGES = 1 << 24
#: a full commit replaces the packs once superseded blobs outweigh the live ones and
#: take more than this many bytes
GARBAGE_BYTES = 1 << 20


# ---------------------------------------------------------------------------- what is written
@dataclass
class Written:
    """What the folder's current commit holds, so that the next one writes only what
    changed (a reader's copy is filled by :func:`read_commit`).

    Attributes:
        commit: the commit's sequence number (0: none yet).
        root: the root blob's ref (None: no commit).
        lsn: the log sequence number the commit covers.
        generation: the store numbering its chunks belong to (a compaction starts a new
            one: every blob is written again).
        chunks: ``[{"ref", "slots": [a, b], "terms": [a, b]}]`` in order (those of
            the chunk pages, then those the root lists).
        chunk_pages: the refs of the chunk pages in order: page ``k`` lists
            ``chunks[k * CHUNK_PAGE:(k + 1) * CHUNK_PAGE]``.
        questions: the questions blob's ref.
        packs: ``{pack: {"end", "live"}}``: each pack's committed end and live bytes.
        segments: conversation id → ``(segment version, entry)`` of the conversations
            this process wrote (the others are read from ``directory`` when needed).
        leaves: ``(page, leaf)`` → ``(ref or None, {id: entry})`` of the leaves this
            process wrote.
        page_leaves: first-level page → its 64 leaf refs, of the pages this process
            wrote.
        pages: first-level page → ref or None.
        next_ordinal: the ordinal of the next new conversation.
        conversations: how many conversations the commit holds.
        directory: the :class:`~memgas_gpu.storage.directory.Directory` of the commit
            read from the folder, where every leaf this process did not write is read
            (None: every leaf is in ``leaves``).
        bytes: the bytes the commit that made this wrote (its blobs; 0 when read).
        ref_tree: the :class:`~memgas_gpu.storage.refs.RefTree` of the commit's
            reference counts (None: a commit written before they were kept).
        ref_slots: conversation id → ``(segment version, slots)`` as this process's
            commits counted them (the others count as the memory's base holds them).
    """

    commit: int = 0
    root: Optional[list] = None
    lsn: int = 0
    generation: int = -1
    chunks: list = field(default_factory=list)
    questions: Optional[list] = None
    packs: dict = field(default_factory=dict)
    segments: dict = field(default_factory=dict)
    leaves: dict = field(default_factory=dict)
    pages: dict = field(default_factory=dict)
    next_ordinal: int = 0
    bytes: int = 0
    page_leaves: dict = field(default_factory=dict)
    conversations: int = 0
    directory: object = None
    chunk_pages: list = field(default_factory=list)
    ref_tree: object = None
    ref_slots: dict = field(default_factory=dict)

    def page_leaf_refs(self, page: int) -> list:
        """The 64 leaf refs of first-level ``page`` in this commit."""
        got = self.page_leaves.get(page)
        if got is not None:
            return got
        if self.directory is not None:
            return self.directory.page_leaves(page)
        return [None] * LEAVES

    def leaf_entries(self, key: tuple) -> dict:
        """``{id: entry}`` of the leaf ``(page, leaf)`` in this commit."""
        got = self.leaves.get(key)
        if got is not None:
            return got[1]
        if self.directory is not None:
            return self.directory.leaf(key)
        return {}

    def entry(self, cid: str) -> Optional[list]:
        """The directory entry of a conversation in this commit, or None."""
        return self.leaf_entries(leaf_of(cid)).get(cid)

    @property
    def n_slots(self) -> int:
        return self.chunks[-1]["slots"][1] if self.chunks else 0

    @property
    def n_terms(self) -> int:
        return self.chunks[-1]["terms"][1] if self.chunks else 0

    def garbage(self) -> tuple[int, int]:
        """``(garbage bytes, live bytes)`` over the packs."""
        size = sum(p["end"] - PACK_HEADER_BYTES for p in self.packs.values())
        live = sum(p["live"] for p in self.packs.values())
        return size - live, live


@dataclass
class CommitInput:
    """What a commit writes (built by the memory, :meth:`MemoryIndex.commit_input`).

    Attributes:
        segments: the conversations in order: objects with ``meta``
            (:class:`~memgas_gpu.memory.meta.ConversationMeta`), ``slots``, ``days``,
            ``graphs`` and ``version`` (None: always written).
        tables: the session store (:class:`~memgas_gpu.memory.store.StoreTables`).
        header: ``params``, ``config``, ``tables``, ``lexical``, ``signal_modules``.
        graph_keys: the graph settings stored with each conversation.
        questions: ``{"records", "conversations", "q_emb", "terms"}``.
        lsn: the log sequence number the commit covers.
        dtype: how embeddings are stored (float32, float16 or bfloat16).
        ordinals: the ordinal of each of ``segments`` (None: 0, 1, ...).
        changed: ``{id: (ordinal, segment or None)}``: the conversations written (None:
            forgotten) since the commit the memory was opened on; a commit that is not
            full writes those of them that differ from what the folder holds, and reads
            nothing of ``segments`` (None: compare every one of ``segments``).
        n_conversations, next_ordinal: the directory's counts (with ``changed``).
        base_slots: conversation id → its slots in the commit the memory was opened
            on (None: not there, or no such commit), for the reference counts of a
            commit that is not full (:mod:`.refs`).
    """

    segments: Sequence
    tables: object
    header: dict
    graph_keys: frozenset
    questions: dict
    lsn: int
    dtype: torch.dtype = torch.float32
    ordinals: Optional[Sequence] = None
    changed: Optional[dict] = None
    n_conversations: int = 0
    next_ordinal: int = 0
    base_slots: Optional[Callable] = None


@dataclass
class Parts:
    """What a reader read (the memory assembles itself from it, one way for every
    format): ``header`` (``params``, ``graphs``, ``config``, ``tables``, ``lexical``,
    ``signal_modules``, ``generation``, ``lsn``), ``store`` (the session store's
    tensors), ``segments`` (``(meta dict, slots, days, graphs)`` per conversation, in
    order) and ``questions`` (``records``, ``conversations``, ``q_emb``, ``terms``)."""

    header: dict
    store: dict
    segments: list
    questions: dict


# ---------------------------------------------------------------------------- writing
def _text_tensors(prefix: str, table) -> dict:
    end = int(table.offsets[-1])
    data = table.data[:end] if end else torch.zeros(0, dtype=torch.uint8)
    return {f"{prefix}.bytes": data, f"{prefix}.offsets": table.offsets}


def vocab_tensors(terms: list) -> dict:
    """The vocabulary ``terms`` as UTF-8 bytes and offsets (``vocab.bytes``,
    ``vocab.offsets``)."""
    enc = [t.encode("utf-8") for t in terms]
    raw = b"".join(enc)
    data = (torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone() if raw
            else torch.zeros(0, dtype=torch.uint8))
    return {"vocab.bytes": data, "vocab.offsets": torch.tensor(
        [0] + [len(e) for e in enc], dtype=torch.int64).cumsum(0)}


def _floats(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.to(dtype) if x.is_floating_point() else x


def _chunk_blob(t, a: int, b: int, t0: int, t1: int, dtype: torch.dtype,
                digests: Optional[list] = None) -> bytes:
    part = t.take(torch.arange(a, b))
    if digests is not None:
        digests.append(part.digest if part.digest is not None else
                       torch.zeros(b - a, DIGEST_BYTES, dtype=torch.uint8))
    x = {"gran": _floats(part.gran, dtype)}
    x.update({f"dense.{k}": _floats(v, dtype) for k, v in part.dense.items()})
    if part.digest is not None:
        x["digest"] = part.digest
    if part.turn_ptr is not None:
        x["turn_ptr"] = part.turn_ptr
    if part.turns is not None:
        x["turns"] = _floats(part.turns, dtype)
    if part.turn_text is not None:
        x.update(_text_tensors("turn_text", part.turn_text))
    if part.lexical_docs is not None:
        for g, m in part.lexical_docs.items():
            x.update({f"lexical.{g}.indptr": m.indptr, f"lexical.{g}.indices": m.indices,
                      f"lexical.{g}.tf": m.tf, f"lexical.{g}.doc_ptr": part.lexical_ptr[g]})
    if t.lexical_base is not None:
        x.update(vocab_tensors(t.lexical_base.vocab.terms[t0:t1]))
    return tensor_blob(x, {"slots": [a, b], "terms": [t0, t1]})


def _segment_blob(seg, keys) -> bytes:
    meta = seg.meta
    x = {"slots": seg.slots.to(torch.int64), "days": seg.days.to(torch.float64)}
    for k in sorted(keys):
        ip, ix = seg.graphs[k]
        x[f"graph.{k}.indptr"], x[f"graph.{k}.indices"] = ip, ix
    return tensor_blob(x, {"id": meta.id, "session_ids": list(meta.session_ids),
                            "session_dates": list(meta.session_dates),
                            "session_metadata": meta.session_metadata})


def _questions_blob(q: dict, dtype: torch.dtype) -> bytes:
    x = {"q_emb": _floats(q["q_emb"].float(), dtype)}
    terms = q.get("terms")
    if terms is not None:
        x.update({"q.indptr": terms.indptr, "q.indices": terms.indices, "q.tf": terms.tf})
    return tensor_blob(x, {"records": q["records"], "conversations": q["conversations"]})


def chunk_slots(t) -> int:
    """Slots per chunk of about :data:`CHUNK_BYTES` (at most :data:`CHUNK_SLOTS`): the
    bytes of a slot's embeddings and digest, and an estimate of its turns."""
    d = t.dim
    per = 4 * (4 * d + d * len(t.dense_names)) + 16
    if t.lazy:
        base = t.base
        per += (8 * 4 * d if base.has_turns else 0) + (16 + 400 if base.has_text else 0)
    else:
        n = max(1, t.n_slots)
        if t.turns is not None:
            per += t.turns.numel() * 4 // n
        if t.turn_text is not None:
            per += (int(t.turn_text.offsets[-1]) + 8 * t.turn_text.offsets.numel()) // n
        if t.lexical_docs is not None:
            per += sum(m.indices.numel() * 12 for m in t.lexical_docs.values()) // n
    return max(1, min(CHUNK_SLOTS, CHUNK_BYTES // per))


def _tier(slots: int) -> int:
    t = 0
    while slots >= CHUNK_FANIN ** (t + 1):
        t += 1
    return t


def _slot_counts(segments, n_slots: int) -> Tensor:
    """``[n_slots]`` rows referring to each slot, counted over every conversation."""
    rows = [seg.slots.to(torch.int64) for seg in segments]
    if not rows:
        return torch.zeros(n_slots, dtype=torch.int64)
    return torch.bincount(torch.cat(rows), minlength=n_slots)


def _write_refs(w: PackWriter, inp: CommitInput, written: Written, full: bool,
                digests: list) -> tuple[list, int, dict, list]:
    """Write the reference counts that changed (:mod:`.refs`); returns the root's
    ``top`` and ``live``, the conversations' counted slots and the blobs written.

    A full commit, or one over a commit without counts, counts every conversation's
    rows; another adds, over the conversations written since the commit before, the
    rows of their new segments and takes away those of the old (as the commit before
    counted them, or the memory's base holds them), reading the counts of those slots
    only."""
    t = inp.tables
    put_cache: list = []
    changed = inp.changed or {}
    tree = written.ref_tree
    if full or tree is None:
        counts = _slot_counts(inp.segments, t.n_slots)
        if counts.numel() > t.n_slots:
            raise IndexFormatError(f"{w.folder}: a conversation refers to slot "
                                   f"{counts.numel() - 1} of a store of {t.n_slots}")
        dig = torch.cat(digests) if digests else t.digest
        leaves: dict = {}
        live = torch.nonzero(counts).squeeze(1).tolist()
        raw = dig.numpy() if dig is not None else None
        for s in live:
            d = raw[s].tobytes() if raw is not None else bytes(DIGEST_BYTES)
            leaves.setdefault(ref_leaf(d, s), {})[s] = (d, int(counts[s]))
        top = write_tree(w, leaves, lambda level, prefix: [None] * FANOUT, [None] * FANOUT,
                         put_cache)
        ref_slots = {cid: (seg.version if seg is not None else None,
                           seg.slots if seg is not None else None)
                     for cid, (_, seg) in changed.items()}
        return top, len(live), ref_slots, put_cache
    ref_slots = dict(written.ref_slots)
    delta: dict = {}
    for cid, (_, seg) in changed.items():
        version = seg.version if seg is not None else None
        got = ref_slots.get(cid)
        if got is not None and got[0] == version and (seg is None or version is not None):
            continue  # counted by an earlier commit of this process
        if got is not None:
            prev = got[1]
        else:
            prev = inp.base_slots(cid) if inp.base_slots is not None else None
        for s in (prev.tolist() if prev is not None else ()):
            delta[s] = delta.get(s, 0) - 1
        for s in (seg.slots.tolist() if seg is not None else ()):
            delta[s] = delta.get(s, 0) + 1
        ref_slots[cid] = (version, seg.slots if seg is not None else None)
    affected = sorted(s for s, k in delta.items() if k)
    if not affected:
        return list(tree.top), tree.live, ref_slots, put_cache
    dig = t.take(torch.tensor(affected, dtype=torch.int64)).digest
    raw = dig.numpy() if dig is not None else None
    leaves = {}
    live = tree.live
    for k, s in enumerate(affected):
        d = raw[k].tobytes() if raw is not None else bytes(DIGEST_BYTES)
        leaf = ref_leaf(d, s)
        entries = leaves.get(leaf)
        if entries is None:
            entries = leaves[leaf] = dict(tree.leaf(leaf))
        old = entries[s][1] if s in entries else 0
        new = old + delta[s]
        if new < 0:
            raise IndexFormatError(f"{tree.where}: refs: slot {s} has {old} references, and "
                                   f"{-delta[s]} of them are gone (the reference counts "
                                   "disagree with the conversations)")
        if new:
            entries[s] = (d, new)
        else:
            entries.pop(s, None)
        live += (new > 0) - (old > 0)
    top = write_tree(w, leaves, tree.node_refs, tree.top, put_cache)
    return top, live, ref_slots, put_cache


def write_commit(folder, inp: CommitInput, written: Written, full: bool = False) -> Written:
    """Write a commit of ``inp`` over the folder's current one (``written``) and make it
    current; returns what the folder then holds.  The caller holds the folder's lock.

    A full commit (``full``, a new store generation, no commit yet, or superseded blobs
    outweighing the live ones) writes every blob to a new pack and removes the packs it
    replaced once the pointer names it; otherwise only what changed is appended.

    Raises:
        OSError: writing failed (a full disk, say): the error names the file; the
            previous commit is still current and nothing this call appended is left.
    """
    folder = Path(folder)
    t = inp.tables
    garbage, live = written.garbage()
    full = (full or inp.changed is None or written.root is None
            or written.generation != t.generation
            or (garbage > live and garbage > GARBAGE_BYTES))
    old = written
    if full:
        written = Written(commit=old.commit, lsn=old.lsn)
    files.make_dirs(folder / DATA)
    w = PackWriter(folder, written.packs, new_pack=full)
    try:
        new, put_cache = _append(w, inp, written, full)
        w.sync()  # every blob of the commit durable before the pointer names it
    except BaseException:
        w.close(failed=True)
        raise
    w.close()
    new.packs = w.packs
    new.bytes = w.written
    prev = old.ref_tree
    pointer = json_blob({"format": FORMAT_NAME, "version": FORMAT_VERSION,
                         "commit": new.commit, "root": new.root})
    try:
        files.replace(folder / POINTER, pointer, "the pointer manifest.json")
        for ref, value in put_cache:  # known as written (a failed commit's are not)
            new.ref_tree.cache.put(ref, value)
    except BaseException:
        new.ref_tree.close()
        try:
            moved = (folder / POINTER).read_bytes() == pointer
        except OSError:
            moved = False
        if not moved:  # the previous commit is current: take back what this one appended
            try:
                if w.created is not None:
                    files.remove([w.path])
                else:
                    os.truncate(w.path, w.start)
            except OSError:
                pass
        else:  # the pointer may name this commit (only the folder's fsync failed): the
            # next commit appends after its blobs, never over them
            for k, p in old.packs.items():
                if k in w.packs:
                    p["end"] = max(p["end"], w.packs[k]["end"])
        raise
    if prev is not None and prev.reader is new.ref_tree.reader:
        new.ref_tree.owns = prev.hand_over()
    elif prev is not None:
        prev.close()  # the packs it read are removed below
    if full:  # the packs the new commit replaced (readers of the old one retry)
        gone = [p for k, p in pack_files(folder).items() if k not in new.packs]
        files.remove(gone)
    return new


def _append(w: PackWriter, inp: CommitInput, written: Written, full: bool
            ) -> tuple[Written, list]:
    """Append the commit's blobs; what the folder then holds, and ``(ref, parsed)`` of
    the reference-count blobs written (:func:`~memgas_gpu.storage.refs.write_tree`)."""
    t = inp.tables
    dtype = inp.dtype
    keys = frozenset(inp.graph_keys)
    # ---- the store: a chunk of the new slots, then merges of one size class
    n_terms = t.n_terms if t.lexical_base is not None else 0
    chunks = list(written.chunks)
    a, t0 = written.n_slots, written.n_terms
    digests: list = []  # of every slot, in order (a full commit)
    if full:
        chunks, a, t0 = [], 0, 0
        step = chunk_slots(t)
        while a < t.n_slots or not chunks:
            b = min(t.n_slots, a + step)
            t1 = n_terms if b == t.n_slots else t0
            chunks.append({"ref": w.put(_chunk_blob(t, a, b, t0, t1, dtype, digests)),
                           "slots": [a, b], "terms": [t0, t1]})
            a, t0 = b, t1
            if a >= t.n_slots:
                break
    elif t.n_slots > a or n_terms > t0:
        chunks.append({"ref": w.put(_chunk_blob(t, a, t.n_slots, t0, n_terms, dtype)),
                       "slots": [a, t.n_slots], "terms": [t0, n_terms]})
        while len(chunks) >= CHUNK_FANIN:
            tail = chunks[-CHUNK_FANIN:]
            if len({_tier(c["slots"][1] - c["slots"][0]) for c in tail}) != 1 or \
                    tail[-1]["slots"][1] - tail[0]["slots"][0] > chunk_slots(t):
                break
            lo, hi = tail[0], tail[-1]
            merged = {"ref": w.put(_chunk_blob(t, lo["slots"][0], hi["slots"][1],
                                               lo["terms"][0], hi["terms"][1], dtype)),
                      "slots": [lo["slots"][0], hi["slots"][1]],
                      "terms": [lo["terms"][0], hi["terms"][1]]}
            for c in tail:
                w.drop(c["ref"])
            chunks[-CHUNK_FANIN:] = [merged]
    # ---- the conversations that changed, and the leaves and pages on their path
    if full:
        segments, leaves, pages, page_leaves = {}, {}, {}, {}
        ordinals = inp.ordinals if inp.ordinals is not None else itertools.count()
        last = -1
        for seg, ordinal in zip(inp.segments, ordinals):
            cid = seg.meta.id
            ref = w.put(_segment_blob(seg, keys))
            entry = [cid, int(ordinal), *ref, seg.n]
            last = max(last, int(ordinal))
            segments[cid] = (seg.version, entry)
            leaves.setdefault(leaf_of(cid), {})[cid] = entry
        work = leaves
        leaves = {}
        n_conv = len(segments)
        next_ordinal = max(last + 1, inp.next_ordinal if inp.ordinals is not None else 0)
    else:
        segments, leaves = dict(written.segments), dict(written.leaves)
        pages, page_leaves = dict(written.pages), dict(written.page_leaves)
        n_conv, next_ordinal = inp.n_conversations, inp.next_ordinal
        work = {}
        for cid, (ordinal, seg) in inp.changed.items():
            key = leaf_of(cid)
            cur = work[key] if key in work else written.leaf_entries(key)
            old = cur.get(cid)
            if seg is None:  # forgotten
                if old is not None:
                    w.drop(old[2:6])
                    cur = dict(cur)
                    del cur[cid]
                    work[key] = cur
                segments.pop(cid, None)
                continue
            got = segments.get(cid)
            if old is not None and got is not None and got[0] == seg.version \
                    and old[1] == ordinal:
                continue  # written by an earlier commit of this process
            if old is not None:
                w.drop(old[2:6])
            ref = w.put(_segment_blob(seg, keys))
            entry = [cid, int(ordinal), *ref, seg.n]
            segments[cid] = (seg.version, entry)
            cur = dict(cur)
            cur[cid] = entry
            work[key] = cur
    for key in sorted(work):
        entries = work[key]
        if not full:
            w.drop(written.page_leaf_refs(key[0])[key[1]])
        if entries:
            body = sorted(entries.values(), key=lambda e: e[1])
            leaves[key] = (w.put(json_blob({"entries": body})), entries)
        else:
            leaves[key] = (None, {})
    for page in sorted({k[0] for k in work}):
        if not full:
            w.drop(pages.get(page))
        refs = list(written.page_leaf_refs(page)) if not full else [None] * LEAVES
        for (p, j), (ref, _) in leaves.items():
            if p == page:
                refs[j] = ref
        page_leaves[page] = refs
        if any(r is not None for r in refs):
            pages[page] = w.put(json_blob({"leaves": refs}))
        else:
            pages.pop(page, None)
    # ---- the chunk list: pages of CHUNK_PAGE entries written once (those still equal
    # to the new list's kept), the rest listed by the root
    chunk_pages = [] if full else list(written.chunk_pages)
    keep = 0
    while keep < len(chunk_pages) and \
            chunks[keep * CHUNK_PAGE:(keep + 1) * CHUNK_PAGE] == \
            written.chunks[keep * CHUNK_PAGE:(keep + 1) * CHUNK_PAGE]:
        keep += 1
    for ref in chunk_pages[keep:]:  # a merge reached into them: listed again
        w.drop(ref)
    chunk_pages = chunk_pages[:keep]
    listed = keep * CHUNK_PAGE
    while len(chunks) - listed >= CHUNK_PAGE + CHUNK_FANIN:
        chunk_pages.append(w.put(json_blob({
            "prev": chunk_pages[-1] if chunk_pages else None,
            "chunks": chunks[listed:listed + CHUNK_PAGE]})))
        listed += CHUNK_PAGE
    # ---- the reference counts of the store's slots
    refs_top, refs_live, ref_slots, put_cache = _write_refs(w, inp, written, full, digests)
    # ---- questions (written once per store generation) and the root
    qref = written.questions
    if full or qref is None:
        qref = w.put(_questions_blob(inp.questions, dtype))
    w.drop(written.root)
    commit = written.commit + 1
    root = dict(inp.header)
    root.update(format=FORMAT_NAME, version=FORMAT_VERSION, commit=commit, lsn=int(inp.lsn),
                generation=int(t.generation), graphs=sorted(keys),
                dim=t.dim, questions=qref, chunks=chunks[listed:],
                chunk_pages={"last": chunk_pages[-1] if chunk_pages else None,
                             "pages": len(chunk_pages)},
                directory={"conversations": n_conv, "next_ordinal": next_ordinal,
                           "pages": [pages.get(i) for i in range(PAGES)]},
                refs={"live": refs_live, "top": refs_top})
    # each pack's end and live bytes as of this commit (the root's own bytes included)
    root["packs"] = {str(k): v for k, v in w.packs.items()}
    for _ in range(3):  # the packs' figures include the root's own length
        body = json_blob(root)
        ends = dict(w.packs)
        ends[w.pack] = {"end": w.end + len(body), "live": w.packs[w.pack]["live"] + len(body)}
        root["packs"] = {str(k): v for k, v in sorted(ends.items())}
    body = json_blob(root)
    root_ref = w.put(body)
    where = f"{w.folder / pack_name(root_ref[0])}: offset {root_ref[1]}: the root"
    prev = written.ref_tree  # None for a full commit: a new pack, a reader of its own
    tree = (RefTree(prev.reader, refs_top, refs_live, t.n_slots, where, prev.cache)
            if prev is not None else
            RefTree(PackReader(w.folder), refs_top, refs_live, t.n_slots, where, owns=True))
    return Written(commit=commit, root=root_ref, lsn=int(inp.lsn), generation=int(t.generation),
                   chunks=chunks, questions=qref, packs=w.packs, segments=segments,
                   leaves=leaves, pages=pages, next_ordinal=next_ordinal,
                   page_leaves=page_leaves, conversations=n_conv,
                   directory=None if full else written.directory, chunk_pages=chunk_pages,
                   ref_tree=tree, ref_slots=ref_slots), put_cache


# ---------------------------------------------------------------------------- reading
def read_pointer(folder) -> dict:
    """The folder's pointer (``manifest.json``) of a format-4 folder, checked.

    Raises:
        FileNotFoundError: no pointer.
        IndexFormatError: not a pointer of this format.
    """
    path = Path(folder) / POINTER
    try:
        raw = files.read_file(path, MAX_JSON_BYTES)
    except ValueError as e:
        raise IndexFormatError(f"{path}: {e}") from None
    try:
        m = json_loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise IndexFormatError(f"{path}: not JSON ({type(e).__name__})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{path}: not a memgas_gpu index")
    if m.get("version") != FORMAT_VERSION:
        raise IndexFormatError(f"{path}: field 'version': {json.dumps(m.get('version'))[:40]}, "
                               f"not {FORMAT_VERSION}")
    if type(m.get("commit")) is not int or m["commit"] < 1:
        raise IndexFormatError(f"{path}: field 'commit': expected a positive integer")
    root = m.get("root")
    if not (isinstance(root, list) and len(root) == 4
            and all(type(x) is int and x >= 0 for x in root)):
        raise IndexFormatError(f"{path}: field 'root': expected a blob reference")
    return m



def _store(r: PackReader, chunks: list, where: str) -> tuple[dict, int, int]:
    parts = []
    expect_slot = expect_term = 0
    for i, c in enumerate(chunks):
        slots, terms = want(f"{where}: chunks[{i}]", c, "slots", list), \
            want(f"{where}: chunks[{i}]", c, "terms", list)
        if slots[:1] != [expect_slot] or terms[:1] != [expect_term] or len(slots) != 2 \
                or len(terms) != 2:
            raise IndexFormatError(f"{where}: chunks[{i}] does not follow the previous one "
                                   "(slots or terms)")
        x, meta = r.tensors(c["ref"], f"store chunk {i}")
        gran = x.get("gran")
        if gran is None or gran.dim() != 3 or gran.shape[0] != slots[1] - slots[0]:
            raise IndexFormatError(f"{where}: chunk {i}: {0 if gran is None else gran.shape[0]} "
                                   f"slots, the root says {slots}")
        n_voc = x["vocab.offsets"].numel() - 1 if "vocab.offsets" in x else 0
        if n_voc != terms[1] - terms[0]:
            raise IndexFormatError(f"{where}: chunk {i}: {n_voc} vocabulary terms, the root "
                                   f"says {terms}")
        keys = set(x)
        if parts and keys != set(parts[0]):
            raise IndexFormatError(f"{where}: chunk {i} holds other tables than chunk 0")
        parts.append(x)
        expect_slot, expect_term = slots[1], terms[1]
    return store_of(parts), expect_slot, expect_term


def _follow(chunks: list, where: str, start: tuple = (0, 0),
            terms: bool = False) -> tuple[int, int]:
    """The chunk entries ``chunks`` follow one another from ``start`` (a slot and a
    vocabulary term; checked without reading the chunks; ``terms``: a store with a
    vocabulary, whose chunks may add terms); the slot and term after the last."""
    expect_slot, expect_term = start
    for i, c in enumerate(chunks):
        slots, terms_ = want(f"{where}: chunks[{i}]", c, "slots", list), \
            want(f"{where}: chunks[{i}]", c, "terms", list)
        if slots[:1] != [expect_slot] or terms_[:1] != [expect_term] or len(slots) != 2 \
                or len(terms_) != 2 or type(slots[1]) is not int or slots[1] < slots[0] \
                or type(terms_[1]) is not int or terms_[1] < terms_[0] \
                or (not terms and terms_[1] != terms_[0]):
            raise IndexFormatError(f"{where}: chunks[{i}] does not follow the previous one "
                                   "(slots or terms)")
        want(f"{where}: chunks[{i}]", c, "ref", list)
        expect_slot, expect_term = slots[1], terms_[1]
    return expect_slot, expect_term


def _chunk_pages(r: PackReader, root: dict, where: str) -> tuple[list, list]:
    """``(page refs, chunk entries)`` of the root's chunk pages, in order, each page
    read (CRC-32) and checked: ``{"prev", "chunks"}``, :data:`CHUNK_PAGE` entries that
    follow one another from the previous page's; the first page names none before it.
    A root without ``chunk_pages`` (written before chunk pages) lists every chunk."""
    if "chunk_pages" not in root:
        return [], []
    cp = want(where, root, "chunk_pages", dict)
    n = want(f"{where}: chunk_pages", cp, "pages", int)
    if not 0 <= n <= MAX_CHUNK_PAGES:
        raise IndexFormatError(f"{where}: chunk_pages: field 'pages': {n} is out of range")
    if "last" not in cp:
        raise IndexFormatError(f"{where}: chunk_pages: field 'last': missing")
    if set(cp) != {"last", "pages"}:
        raise IndexFormatError(f"{where}: chunk_pages: unknown fields "
                               f"{sorted(set(cp) - {'last', 'pages'})[:4]}")
    refs, pages, ref = [], [], cp["last"]
    for k in range(n - 1, -1, -1):
        what = f"store chunk page {k}"
        if ref is None:
            raise IndexFormatError(f"{where}: {what}: missing (the root counts {n} pages)")
        doc = r.json(ref, what)
        at = f"{r.folder / pack_name(ref[0])}: offset {ref[1]}: {what}"
        entries = want(at, doc, "chunks", list)
        if "prev" not in doc or set(doc) != {"prev", "chunks"}:
            raise IndexFormatError(f"{at}: expected the fields 'prev' and 'chunks'")
        if len(entries) != CHUNK_PAGE:
            raise IndexFormatError(f"{at}: {len(entries)} chunks, not {CHUNK_PAGE}")
        refs.append(ref)
        pages.append((at, entries))
        ref = doc["prev"]
    if ref is not None:
        raise IndexFormatError(f"{where}: store chunk page 0 names a page before it (the "
                               f"root counts {n} pages)")
    refs.reverse()
    pages.reverse()
    out: list = []
    at_end = (0, 0)
    for at, entries in pages:
        at_end = _follow(entries, at, at_end, terms=root.get("lexical") is not None)
        out += entries
    return refs, out


def read_commit(folder, pointer: Optional[dict] = None) -> tuple[Parts, Written]:
    """Read the commit the folder's pointer (or ``pointer``) names, every blob's
    checksum checked; the parts still need :func:`memgas_gpu.storage.validate.
    check_parts`.

    Raises:
        IndexFormatError: a damaged or inconsistent commit (one line naming the file
            and offset).
        FileNotFoundError: a pack a writer removed meanwhile (read the pointer again).
    """
    folder = Path(folder)
    pointer = pointer or read_pointer(folder)
    r = PackReader(folder)
    try:
        return _read(r, folder, pointer)
    finally:
        r.close()


def _read(r: PackReader, folder: Path, pointer: dict) -> tuple[Parts, Written]:
    root_ref = pointer["root"]
    where = f"{folder / pack_name(root_ref[0])}: offset {root_ref[1]}: the root"
    root = r.json(root_ref, "the root")
    if not isinstance(root, dict) or root.get("format") != FORMAT_NAME or \
            root.get("version") != FORMAT_VERSION:
        raise IndexFormatError(f"{where}: not the root of a format-{FORMAT_VERSION} commit")
    if root.get("commit") != pointer["commit"]:
        raise IndexFormatError(f"{where}: commit {root.get('commit')}, the pointer names "
                               f"{pointer['commit']}")
    for k, typ in (("lsn", int), ("generation", int), ("chunks", list), ("graphs", list),
                   ("directory", dict), ("packs", dict), ("params", dict), ("config", dict),
                   ("dim", int)):
        want(where, root, k, typ)
    page_refs, chunks = _chunk_pages(r, root, where)
    chunks = chunks + root["chunks"]
    if not chunks:
        raise IndexFormatError(f"{where}: field 'chunks': empty")
    from .directory import Directory

    directory = Directory(folder, root, where, 0, root["graphs"])
    if root.get("lexical") is None:  # read a chunk at a time, when needed
        if any(isinstance(c, dict) and isinstance(c.get("terms"), list) and
               len(c["terms"]) == 2 and c["terms"][0] != c["terms"][1] for c in chunks):
            raise IndexFormatError(f"{where}: field 'lexical': the header and the store "
                                   "disagree on lexical documents")

        paged = len(chunks) - len(root["chunks"])
        start = (chunks[paged - 1]["slots"][1], 0) if paged else (0, 0)
        n_slots, n_terms = _follow(root["chunks"], where, start)[0], 0
        store = StoreChunks(directory.reader, chunks,
                            {k: root.get(k) for k in ("dim", "tables", "lexical")}, where)
    else:
        store, n_slots, n_terms = _store(r, chunks, where)
    directory.n_slots = n_slots
    tree = None
    if "refs" in root:  # written before the store's reference counts were kept: none
        live, top = check_refs_field(where, root["refs"], n_slots)
        tree = RefTree(directory.reader, top, live, n_slots, where)
    if isinstance(store, StoreChunks):
        store.refs = tree
    else:
        store["refs"] = tree
    qx, qmeta = r.tensors(root.get("questions"), "the questions")
    questions = {"records": qmeta.get("records"), "conversations": qmeta.get("conversations"),
                 "q_emb": qx.get("q_emb"),
                 "terms": (qx["q.indptr"], qx["q.indices"], qx["q.tf"])
                 if "q.indptr" in qx else None}
    header = {k: root.get(k) for k in ("params", "graphs", "config", "tables", "lexical",
                                       "signal_modules", "generation", "lsn", "dim")}
    header["n_slots"], header["n_terms"] = n_slots, n_terms
    written = Written(commit=root["commit"], root=pointer["root"], lsn=root["lsn"],
                      generation=root["generation"], chunks=list(chunks),
                      chunk_pages=page_refs,
                      questions=root.get("questions"),
                      packs={int(k): dict(v) for k, v in root["packs"].items()},
                      pages={i: p for i, p in enumerate(directory.pages) if p is not None},
                      next_ordinal=directory.next_ordinal,
                      conversations=directory.count, directory=directory, ref_tree=tree)
    return Parts(header, store, directory, questions), written


def cut_uncommitted(folder, written: Written) -> None:
    """The writer, on opening: cut each pack back to its committed end (what a commit a
    crash interrupted appended) and remove the packs and temporary files no commit
    names.  Called with the folder's lock held."""
    folder = Path(folder)
    for k, p in pack_files(folder).items():
        if k not in written.packs:
            files.remove([p])
            continue
        end = written.packs[k]["end"]
        if p.stat().st_size > end:
            fd = os.open(p, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, end)
                os.fsync(fd)
            finally:
                os.close(fd)
    stale = [p for p in folder.iterdir() if files.is_temporary(p.name)]
    data = folder / DATA
    if data.is_dir():
        stale += [p for p in data.iterdir() if files.is_temporary(p.name)]
    files.remove(stale)
