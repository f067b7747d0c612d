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
log sequence number (LSN) the commit covers, the store's chunks, the questions' blob,
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

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

from .._io import json_loads
from . import files
from .pack import (DATA, MAX_JSON_BYTES, PACK_HEADER_BYTES, PackReader, PackWriter,
                   json_blob, pack_files, pack_name, tensor_blob)
from .validate import IndexFormatError

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "POINTER", "DATA", "WAL", "Written",
           "CommitInput", "Parts", "write_commit", "read_commit", "read_pointer",
           "IndexFormatError", "cut_uncommitted", "store_of", "vocab_tensors"]

FORMAT_NAME = "memgas_gpu.index"
#: the folder format this version writes
FORMAT_VERSION = 4
POINTER = "manifest.json"
WAL = "wal"
#: store chunks of one size class merged at once (each slot rewritten log_8 times)
CHUNK_FANIN = 8
#: slots per chunk a full commit writes at most (bounds the memory a write needs)
CHUNK_SLOTS = 1 << 15
#: a full commit replaces the packs once superseded blobs outweigh the live ones and
#: take more than this many bytes
GARBAGE_BYTES = 1 << 20
_L1 = _LEAF = 64
def _leaf_of(cid: str) -> tuple[int, int]:
    h = int.from_bytes(hashlib.blake2b(cid.encode("utf-8", "surrogatepass"),
                                       digest_size=8).digest(), "little")
    return (h >> 6) % _L1, h % _LEAF


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
        chunks: ``[{"ref", "slots": [a, b], "terms": [a, b]}]`` in order.
        questions: the questions blob's ref.
        packs: ``{pack: {"end", "live"}}``: each pack's committed end and live bytes.
        segments: conversation id → ``(segment version, entry)``.
        leaves: ``(page, leaf)`` → ``(ref or None, {id: entry})``.
        pages: first-level page → ref or None.
        next_ordinal: the ordinal of the next new conversation.
        bytes: the bytes the commit that made this wrote (its blobs; 0 when read).
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
    """

    segments: Sequence
    tables: object
    header: dict
    graph_keys: frozenset
    questions: dict
    lsn: int
    dtype: torch.dtype = torch.float32


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


def _chunk_blob(t, a: int, b: int, t0: int, t1: int, dtype: torch.dtype) -> bytes:
    part = t.take(torch.arange(a, b))
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


def _tier(slots: int) -> int:
    t = 0
    while slots >= CHUNK_FANIN ** (t + 1):
        t += 1
    return t


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
    full = (full or written.root is None or written.generation != t.generation
            or (garbage > live and garbage > GARBAGE_BYTES))
    old = written
    if full:
        written = Written(commit=old.commit, lsn=old.lsn)
    files.make_dirs(folder / DATA)
    w = PackWriter(folder, written.packs, new_pack=full)
    try:
        new = _append(w, inp, written, full)
        w.sync()  # every blob of the commit durable before the pointer names it
    except BaseException:
        w.close(failed=True)
        raise
    w.close()
    new.packs = w.packs
    new.bytes = w.written
    pointer = json_blob({"format": FORMAT_NAME, "version": FORMAT_VERSION,
                         "commit": new.commit, "root": new.root})
    try:
        files.replace(folder / POINTER, pointer, "the pointer manifest.json")
    except BaseException:
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
    if full:  # the packs the new commit replaced (readers of the old one retry)
        gone = [p for k, p in pack_files(folder).items() if k not in new.packs]
        files.remove(gone)
    return new


def _append(w: PackWriter, inp: CommitInput, written: Written, full: bool) -> Written:
    t = inp.tables
    dtype = inp.dtype
    keys = frozenset(inp.graph_keys)
    # ---- the store: a chunk of the new slots, then merges of one size class
    n_terms = t.n_terms if t.lexical_base is not None else 0
    chunks = list(written.chunks)
    a, t0 = written.n_slots, written.n_terms
    if full:
        chunks, a, t0 = [], 0, 0
        step = max(1, CHUNK_SLOTS)
        while a < t.n_slots or not chunks:
            b = min(t.n_slots, a + step)
            t1 = n_terms if b == t.n_slots else t0
            chunks.append({"ref": w.put(_chunk_blob(t, a, b, t0, t1, dtype)),
                           "slots": [a, b], "terms": [t0, t1]})
            a, t0 = b, t1
            if a >= t.n_slots:
                break
    elif t.n_slots > a or n_terms > t0:
        chunks.append({"ref": w.put(_chunk_blob(t, a, t.n_slots, t0, n_terms, dtype)),
                       "slots": [a, t.n_slots], "terms": [t0, n_terms]})
        while len(chunks) >= CHUNK_FANIN:
            tail = chunks[-CHUNK_FANIN:]
            if len({_tier(c["slots"][1] - c["slots"][0]) for c in tail}) != 1:
                break
            lo, hi = tail[0], tail[-1]
            merged = {"ref": w.put(_chunk_blob(t, lo["slots"][0], hi["slots"][1],
                                               lo["terms"][0], hi["terms"][1], dtype)),
                      "slots": [lo["slots"][0], hi["slots"][1]],
                      "terms": [lo["terms"][0], hi["terms"][1]]}
            for c in tail:
                w.drop(c["ref"])
            chunks[-CHUNK_FANIN:] = [merged]
    # ---- the conversations that changed, and the pages on their path
    segments = {} if full else dict(written.segments)
    leaves = {} if full else dict(written.leaves)
    pages = {} if full else dict(written.pages)
    next_ordinal = 0 if full else written.next_ordinal
    present = set()
    touched = set()
    prev = -1  # ordinals increase along the memory's order (a conversation forgotten and
    # added again comes last: it gets a new ordinal)
    for seg in inp.segments:
        cid = seg.meta.id
        present.add(cid)
        got = segments.get(cid)
        in_order = got is not None and got[1][1] > prev
        if in_order and seg.version is not None and got[0] == seg.version:
            prev = got[1][1]
            continue
        if got is not None:
            w.drop(got[1][2:6])
        if in_order:
            ordinal = got[1][1]
        else:
            ordinal, next_ordinal = next_ordinal, next_ordinal + 1
        prev = ordinal
        ref = w.put(_segment_blob(seg, keys))
        entry = [cid, ordinal, *ref, seg.n]
        segments[cid] = (seg.version, entry)
        touched.add(_leaf_of(cid))
    for cid in [c for c in segments if c not in present]:  # forgotten conversations
        w.drop(segments.pop(cid)[1][2:6])
        touched.add(_leaf_of(cid))
    for key in touched:
        ref, entries = leaves.get(key, (None, {}))
        w.drop(ref)
        entries = {cid: segments[cid][1] for cid in (*entries, *(
            c for c in present if _leaf_of(c) == key and c not in entries)) if cid in segments} \
            if not full else {}
        leaves[key] = (None, entries)
    if full:  # every conversation, leaf by leaf
        leaves = {}
        for cid, (_, entry) in segments.items():
            leaves.setdefault(_leaf_of(cid), (None, {}))[1][cid] = entry
        touched = set(leaves)
    for key in sorted(touched):
        _, entries = leaves[key]
        if entries:
            body = sorted(entries.values(), key=lambda e: e[1])
            leaves[key] = (w.put(json_blob({"entries": body})), entries)
        else:
            del leaves[key]
    for page in sorted({k[0] for k in touched}):
        w.drop(pages.get(page))
        refs = [leaves[(page, j)][0] if (page, j) in leaves else None for j in range(_LEAF)]
        if any(r is not None for r in refs):
            pages[page] = w.put(json_blob({"leaves": refs}))
        else:
            pages.pop(page, None)
    # ---- questions (written once per store generation) and the root
    qref = written.questions
    if full or qref is None:
        qref = w.put(_questions_blob(inp.questions, dtype))
    w.drop(written.root)
    commit = written.commit + 1
    root = dict(inp.header)
    root.update(format=FORMAT_NAME, version=FORMAT_VERSION, commit=commit, lsn=int(inp.lsn),
                generation=int(t.generation), graphs=sorted(keys),
                dim=int(t.gran.shape[-1]), questions=qref, chunks=chunks,
                directory={"conversations": len(segments), "next_ordinal": next_ordinal,
                           "pages": [pages.get(i) for i in range(_L1)]})
    # each pack's end and live bytes as of this commit (the root's own bytes included)
    body = json_blob(root)
    root_ref = [w.pack, w.end, 0, 0]
    w.packs[w.pack]["live"] += 0
    root["packs"] = {str(k): v for k, v in w.packs.items()}
    for _ in range(3):  # the packs' figures include the root's own length
        body = json_blob(root)
        ends = dict(w.packs)
        ends[w.pack] = {"end": w.end + len(body), "live": w.packs[w.pack]["live"] + len(body)}
        root["packs"] = {str(k): v for k, v in sorted(ends.items())}
    body = json_blob(root)
    root_ref = w.put(body)
    return Written(commit=commit, root=root_ref, lsn=int(inp.lsn), generation=int(t.generation),
                   chunks=chunks, questions=qref, packs=w.packs, segments=segments,
                   leaves=leaves, pages=pages, next_ordinal=next_ordinal)


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


def _want(where: str, obj, key: str, typ):
    if not isinstance(obj, dict) or key not in obj:
        raise IndexFormatError(f"{where}: field {key!r}: missing")
    v = obj[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise IndexFormatError(f"{where}: field {key!r}: expected {typ.__name__}, got "
                               f"{type(v).__name__}")
    return v


def _cat_ptr(parts: list) -> Tensor:
    out, base = [torch.zeros(1, dtype=torch.int64)], 0
    for p in parts:
        out.append(p[1:] + base)
        base += int(p[-1])
    return torch.cat(out)


def _store(r: PackReader, chunks: list, where: str) -> tuple[dict, int, int]:
    parts = []
    expect_slot = expect_term = 0
    for i, c in enumerate(chunks):
        slots, terms = _want(f"{where}: chunks[{i}]", c, "slots", list), \
            _want(f"{where}: chunks[{i}]", c, "terms", list)
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


def store_of(parts: list) -> dict:
    """The session store's tensors of its chunks' tensors ``parts`` (in slot order),
    laid end to end (pointers rebased)."""
    from ..memory.texts import TextTable

    s: dict = {}
    s["gran"] = torch.cat([x["gran"] for x in parts]).float()
    dense = sorted(k for k in parts[0] if k.startswith("dense."))
    s["dense"] = {k[6:]: torch.cat([x[k] for x in parts]).float() for k in dense}
    s["digest"] = torch.cat([x["digest"] for x in parts]) if "digest" in parts[0] else None
    s["turn_ptr"] = (_cat_ptr([x["turn_ptr"] for x in parts]) if "turn_ptr" in parts[0]
                     else None)
    s["turns"] = torch.cat([x["turns"] for x in parts]).float() if "turns" in parts[0] \
        else None
    if "turn_text.bytes" in parts[0]:
        data = torch.cat([x["turn_text.bytes"] for x in parts])
        s["turn_text"] = TextTable(data if data.numel() else torch.zeros(1, dtype=torch.uint8),
                                   _cat_ptr([x["turn_text.offsets"] for x in parts]))
    else:
        s["turn_text"] = None
    groups = sorted({k.split(".")[1] for k in parts[0] if k.startswith("lexical.")})
    s["lexical"] = None
    if "vocab.bytes" in parts[0]:
        docs, ptr = {}, {}
        for g in groups:
            docs[g] = (_cat_ptr([x[f"lexical.{g}.indptr"] for x in parts]),
                       torch.cat([x[f"lexical.{g}.indices"] for x in parts]),
                       torch.cat([x[f"lexical.{g}.tf"] for x in parts]).float())
            ptr[g] = _cat_ptr([x[f"lexical.{g}.doc_ptr"] for x in parts])
        raw = torch.cat([x["vocab.bytes"] for x in parts])
        s["lexical"] = (docs, ptr, raw, _cat_ptr([x["vocab.offsets"] for x in parts]))
    return s


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
        _want(where, root, k, typ)
    chunks = root["chunks"]
    if not chunks:
        raise IndexFormatError(f"{where}: field 'chunks': empty")
    store, n_slots, n_terms = _store(r, chunks, where)
    qx, qmeta = r.tensors(root.get("questions"), "the questions")
    questions = {"records": qmeta.get("records"), "conversations": qmeta.get("conversations"),
                 "q_emb": qx.get("q_emb"),
                 "terms": (qx["q.indptr"], qx["q.indices"], qx["q.tf"])
                 if "q.indptr" in qx else None}
    directory = root["directory"]
    page_refs = _want(f"{where}: directory", directory, "pages", list)
    if len(page_refs) != _L1:
        raise IndexFormatError(f"{where}: directory: {len(page_refs)} pages, not {_L1}")
    entries, leaves, pages = [], {}, {}
    for i, pref in enumerate(page_refs):
        if pref is None:
            continue
        page = r.json(pref, f"directory page {i}")
        lrefs = _want(f"{where}: page {i}", page, "leaves", list)
        if len(lrefs) != _LEAF:
            raise IndexFormatError(f"{where}: directory page {i}: {len(lrefs)} leaves")
        pages[i] = pref
        for j, lref in enumerate(lrefs):
            if lref is None:
                continue
            leaf = r.json(lref, f"directory leaf {i}.{j}")
            got = _want(f"{where}: leaf {i}.{j}", leaf, "entries", list)
            mine = {}
            for e in got:
                if not (isinstance(e, list) and len(e) == 7 and isinstance(e[0], str)
                        and all(type(x) is int and x >= 0 for x in e[1:])):
                    raise IndexFormatError(f"{where}: leaf {i}.{j}: an entry is not [id, "
                                           "ordinal, pack, offset, length, crc32, sessions]")
                if _leaf_of(e[0]) != (i, j):
                    raise IndexFormatError(f"{where}: leaf {i}.{j}: conversation "
                                           f"{e[0][:80]!r} does not belong in it")
                mine[e[0]] = e
            leaves[(i, j)] = (lref, mine)
            entries.extend(got)
    n_conv = _want(f"{where}: directory", directory, "conversations", int)
    if n_conv != len(entries):
        raise IndexFormatError(f"{where}: the directory lists {len(entries)} conversations, "
                               f"the root says {n_conv}")
    entries.sort(key=lambda e: e[1])
    segments, written_segs = [], {}
    for e in entries:
        x, meta = r.tensors(e[2:6], f"conversation {e[0][:80]!r}")
        graphs = {k[6:-7]: (x[k], x.get(k[:-7] + ".indices")) for k in x
                  if k.startswith("graph.") and k.endswith(".indptr")}
        if meta.get("id") != e[0] or x.get("slots") is None or x["slots"].numel() != e[6]:
            raise IndexFormatError(f"{where}: conversation {e[0][:80]!r}: its segment does "
                                   "not match its directory entry")
        segments.append((meta, x["slots"], x.get("days"), graphs))
        written_segs[e[0]] = (None, e)
    header = {k: root.get(k) for k in ("params", "graphs", "config", "tables", "lexical",
                                       "signal_modules", "generation", "lsn", "dim")}
    header["n_slots"], header["n_terms"] = n_slots, n_terms
    written = Written(commit=root["commit"], root=pointer["root"], lsn=root["lsn"],
                      generation=root["generation"], chunks=list(chunks),
                      questions=root.get("questions"),
                      packs={int(k): dict(v) for k, v in root["packs"].items()},
                      segments=written_segs, leaves=leaves, pages=pages,
                      next_ordinal=int(directory.get("next_ordinal", len(entries))))
    return Parts(header, store, segments, questions), written


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
