"""Checkpoints of a durable memory: the index folder format 3 (docs/index-format.md).

A checkpoint is what a memory opened on a folder holds at one log sequence number
(LSN), in files that each cost what they hold:

* ``data/store-<uuid>.safetensors``: a *chunk* of the session store, the slots
  ``[a, b)`` appended since the previous chunk (embeddings, digests, turn embeddings and
  texts, lexical documents) and the vocabulary terms added with them;
* ``data/seg-<uuid>.safetensors``: one conversation (its session ids, dates, slots,
  parsed days and association graphs);
* ``data/base-<uuid>.safetensors``: the dataset's questions (embeddings and terms);
* ``ckpt-<uuid>.json``: the checkpoint's manifest (settings, configuration, questions,
  and the files above with their CRC-32), named by the folder's pointer
  ``manifest.json`` (format 3).

A checkpoint after some writes writes the changed conversations' segment files, one
chunk of the new slots and a manifest: never the other conversations.  After a
compaction renumbered the slots, every file is written again.  Files are written
beside the current ones, synced, and made current by one replacement of the pointer;
files no checkpoint names are removed afterwards.
"""
from __future__ import annotations

import json
import os
import re
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from .._io import atomic_write, fsync_dir, json_loads
from .validate import IndexFormatError
from ..memory.store import StoreTables
from ..memory.texts import TextTable

__all__ = ["DURABLE_VERSION", "Written", "write_checkpoint", "read_checkpoint",
           "CheckpointParts", "checkpoint_files", "remove_unreferenced", "remove_replaced",
           "written_files"]

#: the index folder format of a durable memory
DURABLE_VERSION = 3
_CKPT = re.compile(r"^ckpt-[0-9a-f]{32}\.json$")
_DATA = re.compile(r"^(store|seg|base)-[0-9a-f]{32}\.safetensors$")
#: store chunks a folder keeps before a checkpoint writes them again as one (each
#: checkpoint with new sessions adds one; merging costs a copy of the store, once per
#: this many checkpoints)
MAX_CHUNKS = 64
#: largest checkpoint manifest read (conversation and question metadata)
MAX_CHECKPOINT_BYTES = 256 << 20


@dataclass
class Written:
    """What the folder holds already (the last checkpoint), so that the next one writes
    only what changed.

    Attributes:
        generation: the store generation the chunks belong to (a compaction starts a
            new one: every file is written again).
        chunks: ``[{"file", "slots": [a, b], "terms": [a, b], "crc"}]`` in order.
        segments: conversation id → ``(segment version, {"file", "crc"})``.
        base: ``{"file", "crc"}`` of the questions, or None.
        lsn: the log sequence number the checkpoint covers.
        name: the checkpoint manifest's file name, or None.
    """

    generation: int = -1
    chunks: list = field(default_factory=list)
    segments: dict = field(default_factory=dict)
    base: Optional[dict] = None
    lsn: int = 0
    name: Optional[str] = None
    #: segment file → its manifest entry as JSON text
    fragments: dict = field(default_factory=dict)

    @property
    def n_slots(self) -> int:
        return self.chunks[-1]["slots"][1] if self.chunks else 0

    @property
    def n_terms(self) -> int:
        return self.chunks[-1]["terms"][1] if self.chunks else 0


def _save(folder: Path, kind: str, tensors: dict, meta: Optional[dict] = None) -> dict:
    """Write one data file (synced); its entry ``{"file", "crc"}``."""
    from safetensors.torch import save

    blob = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                metadata={"memgas": json.dumps(meta or {}, ensure_ascii=False)})
    name = f"data/{kind}-{uuid.uuid4().hex}.safetensors"
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        view, done = memoryview(blob), 0
        while done < len(blob):
            done += os.write(fd, view[done:])
        os.fsync(fd)
    except OSError as e:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise OSError(e.errno, f"{path}: writing a checkpoint file failed ({e.strerror}); "
                      "the previous checkpoint is still current") from None
    os.close(fd)
    return {"file": name, "crc": zlib.crc32(blob)}


def _text_tensors(prefix: str, table: TextTable) -> dict:
    end = int(table.offsets[-1])
    data = table.data[:end] if end else torch.zeros(0, dtype=torch.uint8)
    return {f"{prefix}.bytes": data, f"{prefix}.offsets": table.offsets}


def _terms_tensors(terms: list) -> dict:
    enc = [t.encode("utf-8") for t in terms]
    raw = b"".join(enc)
    data = (torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone() if raw
            else torch.zeros(0, dtype=torch.uint8))
    return {"vocab.bytes": data, "vocab.offsets": torch.tensor(
        [0] + [len(e) for e in enc], dtype=torch.int64).cumsum(0)}


def _chunk(folder: Path, t: StoreTables, a: int, b: int, t0: int, t1: int) -> dict:
    part = t.take(torch.arange(a, b))
    x = {"gran": part.gran}
    x.update({f"dense.{k}": v for k, v in part.dense.items()})
    if part.digest is not None:
        x["digest"] = part.digest
    if part.turn_ptr is not None:
        x["turn_ptr"] = part.turn_ptr
    if part.turns is not None:
        x["turns"] = part.turns
    if part.turn_text is not None:
        x.update(_text_tensors("turn_text", part.turn_text))
    if part.lexical_docs is not None:
        for g, m in part.lexical_docs.items():
            x.update({f"lexical.{g}.indptr": m.indptr, f"lexical.{g}.indices": m.indices,
                      f"lexical.{g}.tf": m.tf, f"lexical.{g}.doc_ptr": part.lexical_ptr[g]})
        x.update(_terms_tensors(t.lexical_base.vocab.terms[t0:t1]))
    entry = _save(folder, "store", x)
    entry.update(slots=[a, b], terms=[t0, t1])
    return entry


def _segment(folder: Path, seg) -> dict:
    x = {"slots": seg.slots, "days": seg.days}
    for k, (ip, ix) in seg.graphs.items():
        x[f"graph.{k}.indptr"], x[f"graph.{k}.indices"] = ip, ix
    entry = _save(folder, "seg", x, {"id": seg.id, "session_ids": seg.meta.session_ids,
                                    "session_dates": seg.meta.session_dates,
                                    "session_metadata": seg.meta.session_metadata})
    entry["id"] = seg.id
    return entry


def write_checkpoint(folder: Path, state, lsn: int, written: Written, header: dict,
                     questions: dict, graph_keys) -> Written:
    """Write a checkpoint of ``state`` (covering the log through ``lsn``) into ``folder``
    and make it current; returns what the folder then holds.

    Args:
        written: what the current checkpoint holds (files are reused when unchanged).
        header: the manifest's settings (format fields, params, config, lexical,
            tables, signal_modules).
        questions: ``{"records", "conversations", "q_emb", "terms"}`` of the dataset's
            questions.
        graph_keys: the graph settings saved with each conversation.
    """
    t = state.tables
    data = folder / "data"
    data.mkdir(exist_ok=True)
    full = written.generation != t.generation or written.name is None
    n_terms = t.n_terms if t.lexical_base is not None else 0
    merge = full or len(written.chunks) >= MAX_CHUNKS
    chunks = [] if merge else list(written.chunks)
    a = 0 if merge else written.n_slots
    t0 = 0 if merge else written.n_terms
    if t.n_slots > a or n_terms > t0 or not chunks:
        chunks.append(_chunk(folder, t, a, t.n_slots, t0, n_terms))
    # one pass over the conversations: an unchanged one keeps its file and its manifest
    # entry's JSON (a dict lookup and a string join), a changed one is written
    keys = set(graph_keys)
    segments, fragments, frags = {}, {}, []
    old_segments, old_fragments = written.segments, written.fragments
    for seg in state.segments:
        sid = seg.meta.id
        got = None if full else old_segments.get(sid)
        if got is not None and got[0] == seg.version:
            frag = old_fragments.get(got[1]["file"])
        else:
            graphs = {k: v for k, v in seg.graphs.items() if k in keys}
            got, frag = (seg.version, _segment(folder, _with_graphs(seg, graphs))), None
        if frag is None:
            frag = json.dumps(got[1], ensure_ascii=False, allow_nan=False)
        segments[sid] = got
        fragments[got[1]["file"]] = frag
        frags.append(frag)
    base = written.base
    if full or base is None:
        qt = {"q_emb": questions["q_emb"]}
        terms = questions.get("terms")
        if terms is not None:
            qt.update({"lexical.q.indptr": terms.indptr, "lexical.q.indices": terms.indices,
                       "lexical.q.tf": terms.tf})
        base = _save(folder, "base", qt)
    manifest = dict(header)
    manifest.update(version=DURABLE_VERSION, lsn=int(lsn), generation=int(t.generation),
                    graphs=sorted(keys), dim=int(t.gran.shape[-1]),
                    questions=questions["records"],
                    question_conversations=questions["conversations"], base=base,
                    chunks=chunks)
    # the segment list is the one part that grows with the conversations: each entry's
    # JSON is kept from the checkpoint that wrote it (above)
    head = json.dumps(manifest, ensure_ascii=False, allow_nan=False)
    text = (head[:-1] + ', "segments": [' + ",".join(frags) + "]}").encode()
    name = f"ckpt-{uuid.uuid4().hex}.json"
    with atomic_write(folder / name, "wb") as f:
        f.write(text)
    fsync_dir(data)
    fsync_dir(folder)
    with atomic_write(folder / "manifest.json", "w", encoding="utf-8") as f:
        json.dump({"format": header["format"], "version": DURABLE_VERSION, "current": name,
                   "manifest_crc32": zlib.crc32(text)}, f, indent=1)
    fsync_dir(folder)
    return Written(int(t.generation), chunks, segments, base, int(lsn), name, fragments)


def _with_graphs(seg, graphs: dict):
    from ..memory.segments import Segment

    return Segment(seg.meta, seg.slots, graphs, seg.version, seg.days)


def checkpoint_files(manifest: dict) -> set:
    """The data files a checkpoint manifest names."""
    out = {c["file"] for c in manifest["chunks"]} | {s["file"] for s in manifest["segments"]}
    if manifest.get("base"):
        out.add(manifest["base"]["file"])
    return out


def remove_replaced(folder: Path, old: Written, new: Written) -> int:
    """Remove the files of checkpoint ``old`` that checkpoint ``new`` (current now) does
    not name: what a checkpoint replaced, without listing the folder.  Called by the
    folder's writer only."""
    keep = _names(new)
    gone = [f for f in _names(old) if f not in keep]
    if old.name and old.name != new.name:
        gone.append(old.name)
    for f in gone:
        (folder / f).unlink(missing_ok=True)
    if gone:
        fsync_dir(folder / "data")
    return len(gone)


def written_files(w: Written) -> set:
    """The data files checkpoint ``w`` names."""
    return _names(w)


def _names(w: Written) -> set:
    return ({c["file"] for c in w.chunks} | {e["file"] for _, e in w.segments.values()}
            | ({w.base["file"]} if w.base else set()))


def remove_unreferenced(folder: Path, keep_checkpoint: str, keep_files: set) -> int:
    """Remove checkpoint manifests and data files the current checkpoint does not name
    (older checkpoints, files of a checkpoint a crash left unfinished); returns how many.
    Called by the folder's writer only."""
    n = 0
    for p in folder.iterdir():
        if _CKPT.match(p.name) and p.name != keep_checkpoint:
            p.unlink(missing_ok=True)
            n += 1
    data = folder / "data"
    if data.is_dir():
        for p in data.iterdir():
            if _DATA.match(p.name) and f"data/{p.name}" not in keep_files:
                p.unlink(missing_ok=True)
                n += 1
    fsync_dir(data if data.is_dir() else folder)
    return n


# ---------------------------------------------------------------------------- reading
@dataclass
class CheckpointParts:
    """What :func:`read_checkpoint` read: the manifest, the store's tensors (whole),
    the segments' parts ``(meta, slots, days, graphs)`` with their file entries, and the
    questions' tensors; ``written`` lacks the segments' versions (the reader's own)."""

    manifest: dict
    name: str
    store: dict
    segments: list
    segment_entries: list
    base: dict
    written: Written


def _load(folder: Path, entry: dict) -> tuple[dict, dict]:
    from safetensors.torch import load

    path = folder / entry["file"]
    raw = path.read_bytes()
    if zlib.crc32(raw) != entry["crc"]:
        raise IndexFormatError(f"{path}: its contents differ from the CRC-32 checksum the "
                               "checkpoint recorded (the file was changed or damaged)")
    try:
        tensors = load(raw)
        n = int.from_bytes(raw[:8], "little")
        meta = json.loads(json.loads(raw[8:8 + n])["__metadata__"]["memgas"])
    except Exception as e:  # noqa: BLE001 - safetensors' and json's errors
        raise IndexFormatError(f"{path}: unreadable checkpoint file ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:160]})") from None
    return tensors, meta


def _cat_ptr(parts: list) -> Tensor:
    out, base = [torch.zeros(1, dtype=torch.int64)], 0
    for p in parts:
        out.append(p[1:] + base)
        base += int(p[-1])
    return torch.cat(out)


def read_checkpoint(folder: Path, pointer: dict) -> CheckpointParts:
    """Read the checkpoint ``pointer`` (the folder's format-3 pointer) names.

    Raises:
        IndexFormatError: a damaged or inconsistent checkpoint (one line naming the
            file); FileNotFoundError: a file a writer removed meanwhile (read again).
    """
    name = pointer["current"]
    if not isinstance(name, str) or not _CKPT.match(name):
        raise IndexFormatError(f"{folder / 'manifest.json'}: field 'current': expected "
                               f"'ckpt-' and 32 hex digits, got {json.dumps(name)[:80]}")
    mf = folder / name
    raw = mf.read_bytes()
    if len(raw) > MAX_CHECKPOINT_BYTES:
        raise IndexFormatError(f"{mf}: {len(raw)} bytes, more than a checkpoint may hold")
    if pointer.get("manifest_crc32") is not None and zlib.crc32(raw) != \
            pointer["manifest_crc32"]:
        raise IndexFormatError(f"{mf}: its contents differ from the CRC-32 checksum the "
                               "folder's pointer recorded (the file was edited or damaged)")
    try:
        m = json_loads(raw.decode("utf-8"))
        chunks, segs = m["chunks"], m["segments"]
        if not isinstance(chunks, list) or not isinstance(segs, list) or not chunks:
            raise ValueError("chunks and segments")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise IndexFormatError(f"{mf}: not a checkpoint manifest ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:120]})") from None
    store: dict = {}
    parts = []
    expect_slot = expect_term = 0
    for c in chunks:
        if c["slots"][0] != expect_slot or c["terms"][0] != expect_term:
            raise IndexFormatError(f"{mf}: chunk {c['file']!r} does not follow the previous "
                                   "one (slots or terms)")
        x, _ = _load(folder, c)
        if x["gran"].shape[0] != c["slots"][1] - c["slots"][0]:
            raise IndexFormatError(f"{folder / c['file']}: {x['gran'].shape[0]} slots, the "
                                   f"checkpoint says {c['slots']}")
        parts.append(x)
        expect_slot, expect_term = c["slots"][1], c["terms"][1]
    store["gran"] = torch.cat([x["gran"] for x in parts]).float()
    dense_names = [k for k in parts[0] if k.startswith("dense.")]
    store["dense"] = {k[6:]: torch.cat([x[k] for x in parts]).float() for k in dense_names}
    store["digest"] = (torch.cat([x["digest"] for x in parts]) if "digest" in parts[0]
                       else None)
    store["turn_ptr"] = (_cat_ptr([x["turn_ptr"] for x in parts]) if "turn_ptr" in parts[0]
                         else None)
    store["turns"] = (torch.cat([x["turns"] for x in parts]).float() if "turns" in parts[0]
                      else None)
    if "turn_text.bytes" in parts[0]:
        data = torch.cat([x["turn_text.bytes"] for x in parts])
        store["turn_text"] = TextTable(data if data.numel() else
                                       torch.zeros(1, dtype=torch.uint8),
                                       _cat_ptr([x["turn_text.offsets"] for x in parts]))
    else:
        store["turn_text"] = None
    groups = sorted({k.split(".")[1] for k in parts[0] if k.startswith("lexical.")})
    store["lexical"] = None
    if groups:
        docs, ptr = {}, {}
        for g in groups:
            docs[g] = (_cat_ptr([x[f"lexical.{g}.indptr"] for x in parts]),
                       torch.cat([x[f"lexical.{g}.indices"] for x in parts]),
                       torch.cat([x[f"lexical.{g}.tf"] for x in parts]).float())
            ptr[g] = _cat_ptr([x[f"lexical.{g}.doc_ptr"] for x in parts])
        terms = []
        for x in parts:
            b, off = x["vocab.bytes"].numpy().tobytes(), x["vocab.offsets"].tolist()
            terms += [b[i:j].decode("utf-8") for i, j in zip(off[:-1], off[1:])]
        store["lexical"] = (docs, ptr, terms)
    segments = []
    for s in segs:
        x, meta = _load(folder, s)
        graphs = {k[6:-7]: (x[k], x[k[:-7] + ".indices"]) for k in x
                  if k.startswith("graph.") and k.endswith(".indptr")}
        n = len(meta["session_ids"])
        if x["slots"].shape != (n,) or x["days"].shape != (n,) or \
                (n and not 0 <= int(x["slots"].min()) <= int(x["slots"].max()) < expect_slot):
            raise IndexFormatError(f"{folder / s['file']}: slots or days do not fit its "
                                   f"{n} sessions and the store's {expect_slot} slots")
        segments.append((meta, x["slots"], x["days"], graphs))
    base, _ = _load(folder, m["base"])
    written = Written(int(m["generation"]), list(chunks), {}, m["base"], int(m["lsn"]), name)
    return CheckpointParts(m, name, store, segments, list(segs), base, written)
