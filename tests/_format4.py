"""An independent reader of the folder format 4 (docs/index-format.md), for tests: the
pointer, the root, the directory, the chunks and the packs, parsed here with ``json``,
``zlib`` and ``struct`` from the documented layout only (nothing of
``memgas_gpu.storage``), so that a test compares the library's files with the document.
"""
from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

PACK_HEADER = 24


def pointer(folder) -> dict:
    return json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8"))


def blob(folder, ref) -> bytes:
    """The bytes a ref ``[pack, offset, length, crc32]`` names (CRC-32 checked)."""
    pack, off, n, crc = ref
    with open(Path(folder) / "data" / f"{pack:08d}.pack", "rb") as f:
        f.seek(off)
        data = f.read(n)
    assert len(data) == n and zlib.crc32(data) == crc, ref
    return data


def json_blob(folder, ref):
    return json.loads(blob(folder, ref).decode("utf-8"))


def tensor_meta(folder, ref) -> dict:
    """The ``memgas`` metadata of a safetensors blob."""
    data = blob(folder, ref)
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(json.loads(data[8:8 + n])["__metadata__"]["memgas"])


def root(folder) -> dict:
    return json_blob(folder, pointer(folder)["root"])


def leaf_of(cid: str) -> tuple[int, int]:
    """The directory page and leaf a conversation id hashes to (BLAKE2b, 8 bytes,
    little-endian: page = (h >> 6) % 64, leaf = h % 64)."""
    h = int.from_bytes(hashlib.blake2b(cid.encode(), digest_size=8).digest(), "little")
    return (h >> 6) % 64, h % 64


def directory(folder) -> dict:
    """``{conversation id: entry}`` of the current commit, each entry
    ``[id, ordinal, pack, offset, length, crc32, sessions]``, read through the pages
    and leaves."""
    out = {}
    for i, pref in enumerate(root(folder)["directory"]["pages"]):
        if pref is None:
            continue
        for j, lref in enumerate(json_blob(folder, pref)["leaves"]):
            if lref is None:
                continue
            for e in json_blob(folder, lref)["entries"]:
                assert leaf_of(e[0]) == (i, j), e[0]
                out[e[0]] = e
    return out


#: chunk entries per chunk page
CHUNK_PAGE = 16


def chunk_pages(folder) -> list:
    """``[(ref, entries)]`` of the current commit's chunk pages, first to last: the root's
    ``chunk_pages`` names the last page and their number, each page ``{"prev",
    "chunks"}`` the page before it (None for the first) and its 16 chunk entries."""
    cp = root(folder).get("chunk_pages", {"last": None, "pages": 0})
    out, ref = [], cp["last"]
    for _ in range(cp["pages"]):
        page = json_blob(folder, ref)
        assert sorted(page) == ["chunks", "prev"] and len(page["chunks"]) == CHUNK_PAGE, ref
        out.append((ref, page["chunks"]))
        ref = page["prev"]
    assert ref is None, "the first page names no page before it"
    return out[::-1]


def chunks(folder) -> list:
    """Every chunk entry ``{"ref", "slots", "terms"}`` of the current commit, in order:
    those of the chunk pages, then those the root lists."""
    out = [e for _, entries in chunk_pages(folder) for e in entries]
    return out + root(folder)["chunks"]


def pack_sizes(folder) -> dict:
    """``{pack id: bytes}`` of the packs in the folder."""
    d = Path(folder) / "data"
    return {int(p.stem): p.stat().st_size for p in d.glob("*.pack")} if d.is_dir() else {}


def folder_bytes(folder) -> dict:
    """``{relative path: bytes}`` of every file of the folder."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


# ---------------------------------------------------------------- packs, commits and the log
PACK_MAGIC = b"MGAS-PCK"
LOG_MAGIC = b"MGAS-WAL"
LOG_HEADER = 24
#: a record's header: payload length u32 | CRC-32 u32 | number u64 | group u64
RECORD_HEADER = 24


def pack_header(folder, pack: int) -> tuple:
    """``(magic, format version, pack number)`` of a pack's 24-byte header (its CRC-32
    checked)."""
    with open(Path(folder) / "data" / f"{pack:08d}.pack", "rb") as f:
        head = f.read(PACK_HEADER)
    assert len(head) == PACK_HEADER, pack
    assert zlib.crc32(head[:20]) == struct.unpack("<I", head[20:])[0], f"pack {pack}: header CRC"
    return struct.unpack("<8sIQ", head[:20])


def commit_blobs(folder) -> list:
    """``[(what, ref)]`` of every blob the current commit names: the root, the store
    chunks, the questions, the directory pages and leaves, and each conversation's
    segment (every one read here, its CRC-32 checked)."""
    ptr = pointer(folder)
    r = json_blob(folder, ptr["root"])
    out = [("root", ptr["root"])]
    out += [(f"chunk page {k}", ref) for k, (ref, _) in enumerate(chunk_pages(folder))]
    out += [(f"chunk {i}", c["ref"]) for i, c in enumerate(chunks(folder))]
    out.append(("questions", r["questions"]))
    for i, pref in enumerate(r["directory"]["pages"]):
        if pref is None:
            continue
        out.append((f"page {i}", pref))
        for j, lref in enumerate(json_blob(folder, pref)["leaves"]):
            if lref is None:
                continue
            out.append((f"leaf {i}.{j}", lref))
            out += [(f"segment {e[0]}", e[2:6]) for e in json_blob(folder, lref)["entries"]]
    out += [(what, ref) for what, ref, _ in ref_blobs(folder)]
    for _, ref in out:
        blob(folder, ref)
    return out


# ---- the store's reference counts: a tree of 16-way nodes over 16**4 leaves; the root's
# refs.top is the first level, each node {"refs": [16 refs or null]}, each leaf
# {"entries": [[digest hex, slot, count], ...]}; an entry is in the leaf its key hashes
# to (the digest, or for an all-zero digest: 16 zero bytes, b"slot", the slot as 8
# little-endian bytes; BLAKE2b of 8 bytes, little-endian, modulo 65536), leaf L under
# top[L >> 12], then child (L >> 8) & 15, (L >> 4) & 15, L & 15.
REF_FANOUT, REF_LEVELS = 16, 4


def ref_leaf(digest: bytes, slot: int) -> int:
    key = digest if any(digest) else bytes(16) + b"slot" + slot.to_bytes(8, "little")
    h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return h % REF_FANOUT ** REF_LEVELS


def ref_blobs(folder) -> list:
    """``[(what, ref, parsed)]`` of every node and leaf of the reference counts' tree."""
    out = []

    def walk(refs, level, prefix):
        for i, ref in enumerate(refs):
            if ref is None:
                continue
            at = prefix * REF_FANOUT + i
            doc = json_blob(folder, ref)
            if level == REF_LEVELS:
                out.append((f"reference leaf {at}", ref, doc))
            else:
                out.append((f"reference node {level + 1}.{at}", ref, doc))
                walk(doc["refs"], level + 1, at)

    walk(root(folder)["refs"]["top"], 1, 0)
    return out


def ref_counts(folder) -> dict:
    """``{slot: (digest hex, count)}`` of the current commit, each entry checked to be in
    the leaf its key hashes to."""
    out = {}
    for what, _, doc in ref_blobs(folder):
        if not what.startswith("reference leaf"):
            continue
        leaf = int(what.rsplit(" ", 1)[1])
        for d, slot, count in doc["entries"]:
            assert ref_leaf(bytes.fromhex(d), slot) == leaf, (what, slot)
            assert slot not in out
            out[slot] = (d, count)
    assert len(out) == root(folder)["refs"]["live"]
    return out


def ref_path(folder, leaf: int) -> list:
    """The refs of the nodes below the root and of the leaf on ``leaf``'s path (None
    where the path ends)."""
    refs, out = root(folder)["refs"]["top"], []
    for level in range(REF_LEVELS):
        ref = refs[(leaf >> (4 * (REF_LEVELS - 1 - level))) & 15]
        out.append(ref)
        if ref is None or level == REF_LEVELS - 1:
            break
        refs = json_blob(folder, ref)["refs"]
    return out


def path_of(folder, cid: str) -> dict:
    """The refs on a conversation's path in the current commit: ``{"page", "leaf",
    "segment"}`` (its entry's segment; None where there is none)."""
    i, j = leaf_of(cid)
    pref = root(folder)["directory"]["pages"][i]
    lref = json_blob(folder, pref)["leaves"][j] if pref is not None else None
    seg = None
    if lref is not None:
        seg = next((e[2:6] for e in json_blob(folder, lref)["entries"] if e[0] == cid), None)
    return {"page": pref, "leaf": lref, "segment": seg}


def log_files(folder) -> dict:
    """``{number of the first record: path}`` of the log files in ``wal/``."""
    d = Path(folder) / "wal"
    return {int(p.stem): p for p in d.glob("*.log") if p.stem.isdigit()} if d.is_dir() else {}


def log_records(folder) -> list:
    """``[(number, group, payload)]`` of the whole records of the log, file by file in
    order (each file's header and each record's CRC-32 checked); a file's records stop
    at its first short or invalid one (a torn tail)."""
    out = []
    for first, path in sorted(log_files(folder).items()):
        raw = path.read_bytes()
        head = raw[:LOG_HEADER]
        assert head[:8] == LOG_MAGIC and zlib.crc32(head[:20]) == \
            struct.unpack("<I", head[20:24])[0], path
        assert struct.unpack("<Q", head[12:20])[0] == first, path
        pos, expect = LOG_HEADER, first
        while pos + RECORD_HEADER <= len(raw):
            n, crc, num, group = struct.unpack("<IIQQ", raw[pos:pos + RECORD_HEADER])
            payload = raw[pos + RECORD_HEADER:pos + RECORD_HEADER + n]
            if len(payload) != n or zlib.crc32(payload, zlib.crc32(raw[pos + 8:pos + 24])) \
                    != crc or num != expect:
                break
            out.append((num, group, payload))
            pos += RECORD_HEADER + n
            expect += 1
    return out


def record_ops(payload: bytes) -> list:
    """The operations (JSON) a record's payload holds: its safetensors metadata holds
    ``{"v": 2, "ops": [...]}``."""
    n = struct.unpack("<Q", payload[:8])[0]
    meta = json.loads(payload[8:8 + n])["__metadata__"]
    for value in meta.values():
        try:
            got = json.loads(value)
        except ValueError:
            continue
        if isinstance(got, dict) and "ops" in got:
            return got["ops"]
    raise AssertionError(f"no operations in the record's metadata {sorted(meta)}")


# ---------------------------------------------------------------- the log (format 2)
#: a log file's header: magic, format version u32, first record u64, then the CRC-32 of
#: those 20 bytes (u32)
WAL_MAGIC = b"MGAS-WAL"
WAL_HEAD = struct.Struct("<8sIQ")
WAL_HEADER = 24
#: a record (format 2): length u32 | CRC-32 of (number u64 + group u64 + payload) u32 |
#: number u64 | group u64 | payload
WAL_RECORD = struct.Struct("<IIQQ")
#: a record of format 1 (read only): length u32 | CRC-32 of (number u64 + payload) u32 |
#: number u64 | payload
WAL_RECORD_V1 = struct.Struct("<IIQ")


def wal_header(first: int, version: int = 2) -> bytes:
    head = WAL_HEAD.pack(WAL_MAGIC, version, first)
    return head + struct.pack("<I", zlib.crc32(head))


def record_crc(lsn: int, group: int, payload: bytes) -> int:
    """The documented CRC-32 of a record: over its number and group (u64 little-endian
    each) and then its payload."""
    return zlib.crc32(struct.pack("<QQ", lsn, group) + payload)


def frame(lsn: int, group: int, payload: bytes, crc=None) -> bytes:
    """A record framed as documented (``crc``: another checksum, to forge damage)."""
    crc = record_crc(lsn, group, payload) if crc is None else crc
    return WAL_RECORD.pack(len(payload), crc, lsn, group) + payload


def frame_v1(lsn: int, payload: bytes) -> bytes:
    """A record of format 1 (no group; CRC-32 of number + payload)."""
    crc = zlib.crc32(struct.pack("<Q", lsn) + payload)
    return WAL_RECORD_V1.pack(len(payload), crc, lsn) + payload


def wal_files(folder) -> list:
    """The log files of the log folder ``folder`` (``wal/``), in order."""
    return sorted(p for p in Path(folder).iterdir() if p.suffix == ".log")


def parse_log_file(path) -> dict:
    """A log file read as the format says, without trusting its checksums: the header's
    fields and every whole record ``(offset, length, crc, lsn, group, payload)`` (group
    None in a format-1 file); ``end`` is where the last whole record ends, ``size`` the
    file's size."""
    data = Path(path).read_bytes()
    assert len(data) >= WAL_HEADER, f"{path}: shorter than a header"
    magic, version, first = WAL_HEAD.unpack_from(data)
    (hcrc,) = struct.unpack_from("<I", data, WAL_HEAD.size)
    rec = WAL_RECORD if version >= 2 else WAL_RECORD_V1
    records, pos = [], WAL_HEADER
    while pos + rec.size <= len(data):
        fields = rec.unpack_from(data, pos)
        length, crc, lsn = fields[:3]
        group = fields[3] if version >= 2 else None
        if pos + rec.size + length > len(data):
            break
        records.append((pos, length, crc, lsn, group,
                        data[pos + rec.size:pos + rec.size + length]))
        pos += rec.size + length
    return {"magic": magic, "version": version, "first": first, "header_crc": hcrc,
            "head": data[:WAL_HEAD.size], "records": records, "end": pos,
            "size": len(data)}


def wal_checked(folder, versions=(2,)) -> list:
    """``(number, group, payload)`` of every record of the log ``folder``, each file
    checked to be exactly as documented: its name (20 digits: its first record), header
    and header CRC, every record's CRC (over number + group + payload), numbers
    consecutive within and across files, each group the number of the first record of
    its write (a record starts a write, or shares the previous record's group), and no
    byte after the last record.  ``versions``: the file formats accepted."""
    out, expected = [], None
    for path in wal_files(folder):
        f = parse_log_file(path)
        where = path.name
        assert len(path.stem) == 20 and path.stem.isdigit(), where
        assert f["magic"] == WAL_MAGIC and f["version"] in versions, (where, f["version"])
        assert f["header_crc"] == zlib.crc32(f["head"]), \
            f"{where}: the header's CRC is not the CRC-32 of its first 20 bytes"
        assert f["first"] == int(path.stem), f"{where}: its header says {f['first']}"
        assert f["end"] == f["size"], \
            f"{where}: {f['size'] - f['end']} bytes after the last record"
        if expected is not None:
            assert f["first"] == expected, f"{where}: starts at {f['first']}, not {expected}"
        lsn, prev_group = f["first"], None
        for offset, _, crc, got, group, payload in f["records"]:
            assert got == lsn, f"{where} offset {offset}: record {got} where {lsn} belongs"
            if group is None:  # format 1
                want = zlib.crc32(struct.pack("<Q", got) + payload)
            else:
                want = record_crc(got, group, payload)
                assert group == got or (prev_group is not None and group == prev_group), \
                    (f"{where} offset {offset}: record {got} names group {group}, neither "
                     f"itself nor the group of the record before it ({prev_group})")
            assert crc == want, (
                f"{where} offset {offset}: CRC {crc:#010x} is not the documented "
                f"{want:#010x}" + (" (it is the payload's alone)"
                                    if crc == zlib.crc32(payload) else ""))
            out.append((got, group, payload))
            prev_group = group
            lsn += 1
        expected = lsn
    return out



# ---------------------------------------------------------------- hostile folders
# What an editor who knows the format can do: blobs appended to the last pack with their
# CRC-32 recomputed, the directory path and the root written again, the pointer moved to
# the new root.  The reader's checksums then pass, so its *validation* must refuse what
# was changed (the safetensors layout and the ``memgas`` metadata as documented).
def _dumps(value) -> bytes:
    # ensure_ascii: a lone surrogate is written as an escape (valid JSON that a reader
    # decodes to a string that is not valid Unicode text)
    return json.dumps(value, separators=(",", ":")).encode("ascii")


def blob_tensors(folder, ref) -> tuple:
    """``(tensors, memgas metadata)`` of a safetensors blob."""
    from safetensors.torch import load

    data = blob(folder, ref)
    return dict(load(data)), tensor_meta(folder, ref)


def tensor_blob(tensors: dict, meta: dict) -> bytes:
    """A safetensors blob of ``tensors`` with ``meta`` as its ``memgas`` metadata."""
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in tensors.items()},
                metadata={"memgas": json.dumps(meta)})


def _last_pack(folder) -> Path:
    packs = sorted((Path(folder) / "data").glob("*.pack"))
    return packs[-1]


def append_blob(folder, data: bytes) -> list:
    """Append ``data`` to the folder's last pack; its ref ``[pack, offset, length,
    crc32]``."""
    path = _last_pack(folder)
    with open(path, "ab") as f:
        off = f.tell()
        f.write(data)
    return [int(path.stem), off, len(data), zlib.crc32(data)]


def set_root(folder, new_root=None, raw: bytes = None) -> list:
    """Append a root (``new_root``, a dict, or the bytes ``raw`` as they are) and point
    ``manifest.json`` at it (the pointer's commit kept); the root's ``packs`` record the
    last pack's end past the root itself (a writer opening the folder cuts a pack back
    to that end).  Returns the root's ref."""
    path = _last_pack(folder)
    if raw is None:
        r = dict(new_root)
        packs = dict(r.get("packs") or {})
        start = path.stat().st_size
        body = b""
        for _ in range(4):  # the end includes the root's own length
            key = str(int(path.stem))
            packs[key] = dict(packs.get(key) or {"live": 0}, end=start + len(body))
            r["packs"] = packs
            body = _dumps(r)
        raw = body
    ref = append_blob(folder, raw)
    ptr = pointer(folder)
    ptr["root"] = ref
    (Path(folder) / "manifest.json").write_bytes(_dumps(ptr))
    return ref


def rewrite(folder, root_edit=None, chunks=None, segments=None, questions=None) -> None:
    """Write a new commit of ``folder`` where the given blobs are replaced, each CRC-32
    recomputed: ``chunks`` ``{index: bytes}`` (an index into the chunks the root
    lists), ``segments`` ``{conversation id: bytes}``
    (the directory entry's session count follows the blob's ``slots``; its leaf and page
    are written again), ``questions`` bytes; then ``root_edit(root)`` (a function that
    changes the root in place) and the pointer moved to the new root."""
    r = root(folder)
    for i, data in (chunks or {}).items():
        r["chunks"][i]["ref"] = append_blob(folder, data)
    if questions is not None:
        r["questions"] = append_blob(folder, questions)
    for cid, data in (segments or {}).items():
        i, j = leaf_of(cid)
        page = json_blob(folder, r["directory"]["pages"][i])
        leaf = json_blob(folder, page["leaves"][j])
        entry = next(e for e in leaf["entries"] if e[0] == cid)
        entry[2:6] = append_blob(folder, data)
        try:
            from safetensors.torch import load

            entry[6] = int(load(data)["slots"].numel())
        except Exception:  # noqa: BLE001 - not a segment a reader can parse: kept
            pass
        page["leaves"][j] = append_blob(folder, _dumps(leaf))
        r["directory"]["pages"][i] = append_blob(folder, _dumps(page))
    if root_edit is not None:
        root_edit(r)
    set_root(folder, r)


def edit_chunk(folder, i: int, edit) -> None:
    """``edit(tensors, meta)`` on store chunk ``i`` (in place; one the root lists),
    written as a new commit."""
    assert "chunk_pages" not in root(folder) or root(folder)["chunk_pages"]["pages"] == 0, \
        "edit_chunk edits the chunks a root lists; this folder has chunk pages"
    t, m = blob_tensors(folder, root(folder)["chunks"][i]["ref"])
    edit(t, m)
    rewrite(folder, chunks={i: tensor_blob(t, m)})


def edit_segment(folder, cid: str, edit) -> None:
    """``edit(tensors, meta)`` on conversation ``cid``'s segment, as a new commit."""
    t, m = blob_tensors(folder, path_of(folder, cid)["segment"])
    edit(t, m)
    rewrite(folder, segments={cid: tensor_blob(t, m)})


def edit_questions(folder, edit) -> None:
    """``edit(tensors, meta)`` on the questions' blob, as a new commit."""
    t, m = blob_tensors(folder, root(folder)["questions"])
    edit(t, m)
    rewrite(folder, questions=tensor_blob(t, m))


def edit_root(folder, edit) -> None:
    """``edit(root)`` (in place) as a new commit."""
    rewrite(folder, root_edit=edit)


def counted_refs(folder) -> dict:
    """``{slot: (digest hex, count)}`` as the commit's conversations and store say: the
    rows of every segment referring to each slot, and the slot's digest in its chunk
    (what :func:`ref_counts` must equal)."""
    counts: dict = {}
    for e in directory(folder).values():
        for s in blob_tensors(folder, e[2:6])[0]["slots"].tolist():
            counts[s] = counts.get(s, 0) + 1
    digests = {}
    for c in chunks(folder):
        d = blob_tensors(folder, c["ref"])[0].get("digest")
        a, b = c["slots"]
        for k in range(b - a):
            digests[a + k] = bytes(d[k].tolist()).hex() if d is not None else "0" * 32
    return {s: (digests[s], n) for s, n in counts.items()}


def edit_ref_leaf(folder, leaf: int, edit, level: int = REF_LEVELS - 1) -> None:
    """Rewrite reference leaf ``leaf`` (or the node at ``level`` on its path: 0 is the
    node ``top`` names, 3 the leaf; ``edit(doc)`` changes it in place; CRC-32
    recomputed) and the nodes above it, and point the root at them."""
    path = ref_path(folder, leaf)
    assert len(path) == REF_LEVELS and path[-1] is not None, "no such leaf"
    doc = json_blob(folder, path[level])
    edit(doc)
    ref = append_blob(folder, _dumps(doc))
    for up in range(level - 1, -1, -1):  # the nodes above, bottom up
        node = json_blob(folder, path[up])
        node["refs"][(leaf >> (4 * (REF_LEVELS - 2 - up))) & 15] = ref
        ref = append_blob(folder, _dumps(node))
    r = root(folder)
    r["refs"]["top"][leaf >> 12] = ref
    set_root(folder, r)
