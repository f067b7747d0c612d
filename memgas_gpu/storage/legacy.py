"""The one reader of older folder formats, each turned into the
:class:`~memgas_gpu.storage.commit.Parts` every format becomes (then checked and
assembled as a commit is):

* version 1: ``manifest.json`` and ``tensors.safetensors`` at the top of the folder;
* version 2: a pointer ``manifest.json`` naming a complete version ``v-<32 hex>/``
  (``manifest.json`` + ``tensors.safetensors``), written by ``save`` before format 4;
* version 3: a durable memory's checkpoint (a pointer naming ``ckpt-<32 hex>.json``, its
  files in ``data/``) and its log in ``wal/`` (read by :mod:`.log`, which knows both
  record formats).

Nothing here writes: a folder is converted to format 4 by the first commit of a memory
that opens it (or a ``save`` over it), which then removes these files.
"""
from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Optional

import torch

from .._io import find_surrogate, json_loads, may_hold_surrogate
from . import files
from .chunks import store_of
from .commit import Parts
from .validate import IndexFormatError

__all__ = ["read_legacy", "legacy_files", "LEGACY_VERSION", "MAX_MANIFEST_BYTES"]

#: the version name of a version-1 folder (no pointer, no versions)
LEGACY_VERSION = "v1-folder"
#: largest manifest read (conversation and question metadata)
MAX_MANIFEST_BYTES = 256 << 20
_VERSION_DIR = re.compile(r"^v-[0-9a-f]{32}$")
_CKPT = re.compile(r"^ckpt-[0-9a-f]{32}\.json$")
_DATA = re.compile(r"^(store|seg|base)-[0-9a-f]{32}\.safetensors$")


def read_json(path: Path, cap: int = MAX_MANIFEST_BYTES):
    """The JSON value of the file ``path`` (at most ``cap`` bytes, strict numbers, no
    lone surrogate) and its bytes.

    Raises:
        FileNotFoundError: no such file.
        IndexFormatError: not a regular file, too large, not UTF-8 JSON.
    """
    try:
        raw = files.read_file(path, cap)
    except (ValueError, IsADirectoryError) as e:
        what = "a folder, not a file" if isinstance(e, IsADirectoryError) else str(e)
        raise IndexFormatError(f"{path}: {what}") from None
    try:
        text = raw.decode("utf-8")
        m = json_loads(text)
    except UnicodeDecodeError as e:
        raise IndexFormatError(f"{path}: not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise IndexFormatError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None
    except ValueError as e:
        raise IndexFormatError(f"{path}: invalid JSON ({e})") from None
    except RecursionError:
        raise IndexFormatError(f"{path}: JSON nested too deeply") from None
    bad = find_surrogate(m) if may_hold_surrogate(text) else None
    if bad is not None:
        raise IndexFormatError(f"{path}: field {bad!r}: a lone UTF-16 surrogate escape (not "
                               "valid Unicode text)")
    return m, raw


def _load_tensors(tf: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not tf.is_file():  # a FIFO or a device would block or stream forever
        raise FileNotFoundError(tf) if not tf.exists() else \
            IndexFormatError(f"{tf}: not a regular file")
    try:
        return load_file(str(tf))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        if isinstance(e, FileNotFoundError) or not tf.exists():
            raise FileNotFoundError(tf) from None  # removed by a writer: the caller retries
        msg = " ".join(str(e).split())[:200]
        raise IndexFormatError(f"{tf}: unreadable safetensors file ({msg})") from None


def _crc32(x) -> int:
    flat = x.detach().contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(flat.numpy())


def _want(where: str, m, key: str, typ):
    if not isinstance(m, dict) or key not in m:
        raise IndexFormatError(f"{where}: field {key!r}: missing")
    v = m[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise IndexFormatError(f"{where}: field {key!r}: expected "
                               f"{'a list' if typ is list else typ.__name__}, got "
                               f"{type(v).__name__}")
    return v


def _ptr_ok(x, n: Optional[int], end: int) -> bool:
    return (x.dim() == 1 and x.dtype == torch.int64 and (n is None or x.numel() == n + 1)
            and x.numel() > 0 and int(x[0]) == 0 and int(x[-1]) == end
            and not bool((x[1:] < x[:-1]).any()))


# ---------------------------------------------------------------------------- versions 1, 2
def _packed_parts(where: str, m: dict, t: dict) -> Parts:
    """A version-1/2 folder's whole-index manifest and tensors as parts (conversations
    split apart; what cannot be split is refused, the rest is checked as any commit)."""
    from ..memory.texts import TextTable
    from ..ops.csr import split_csr

    convs = _want(where, m, "conversations", list)
    for c in convs:
        _want(where, c, "session_ids", list)
        _want(where, c, "id", str)
    records = _want(where, m, "questions", list)
    graphs = _want(where, m, "graphs", list)
    offsets, row_slot = t.get("conv_offsets"), t.get("row_slot")
    for name, x in (("conv_offsets", offsets), ("row_slot", row_slot)):
        if x is None or x.dim() != 1 or x.dtype != torch.int64:
            raise IndexFormatError(f"{where}: tensor {name!r}: missing, or not int64 [n]")
    n_rows = row_slot.numel()
    if not _ptr_ok(offsets, len(convs), n_rows):
        raise IndexFormatError(f"{where}: tensor 'conv_offsets': not non-decreasing offsets "
                               f"from 0 ending at {n_rows}")
    sizes = (offsets[1:] - offsets[:-1]).tolist()
    for c, conv in enumerate(convs):
        if sizes[c] != len(conv["session_ids"]):
            raise IndexFormatError(f"{where}: conversation {c} ({conv['id'][:80]!r}) has "
                                   f"{len(conv['session_ids'])} session ids but {sizes[c]} "
                                   "rows in 'conv_offsets'")
    split = {}
    for g in graphs:
        ip, ix = t.get(f"graph.{g}.indptr"), t.get(f"graph.{g}.indices")
        if ip is None or ix is None or ix.dim() != 1 or not _ptr_ok(ip, 4 * n_rows,
                                                                      ix.numel()):
            raise IndexFormatError(f"{where}: tensor 'graph.{g}.indptr': missing, or not "
                                   f"CSR row pointers over {4 * n_rows} nodes")
        split[g] = split_csr(ip, ix, (offsets * 4).tolist())
    offs = offsets.tolist()
    segments = [({"id": c["id"], "session_ids": c["session_ids"],
                  "session_dates": c.get("session_dates"),
                  "session_metadata": c.get("session_metadata")},
                 row_slot[offs[i]:offs[i + 1]].clone(), None,
                 {g: split[g][i] for g in graphs}) for i, c in enumerate(convs)]
    q_conv = t.get("q_conv")
    if q_conv is None or q_conv.dim() != 1 or q_conv.numel() != len(records) or \
            (q_conv.numel() and (int(q_conv.min()) < 0 or int(q_conv.max()) >= len(convs))):
        raise IndexFormatError(f"{where}: tensor 'q_conv': missing, or not a conversation "
                               "position per question")
    names = m.get("tables", ["concat"] if "concat" in t else [])
    lexical = None
    lex = m.get("lexical")
    if lex:
        keys = (lex.get("granularities") if isinstance(lex, dict) else None) or \
            ["S", "T", "U", "K"]
        try:
            docs = {g: (t[f"lexical.{g}.indptr"], t[f"lexical.{g}.indices"],
                        t[f"lexical.{g}.tf"]) for g in keys}
            ptr = {g: t[f"lexical.{g}.doc_ptr"] for g in keys}
            lexical = (docs, ptr, t["lexical.vocab.bytes"], t["lexical.vocab.offsets"])
        except KeyError as e:
            raise IndexFormatError(f"{where}: tensor {e.args[0]!r}: missing") from None
    text = None
    if "turn_text.bytes" in t or "turn_text.offsets" in t:
        if "turn_text.bytes" not in t or "turn_text.offsets" not in t:
            raise IndexFormatError(f"{where}: tensor 'turn_text.bytes': missing its pair")
        text = TextTable(t["turn_text.bytes"], t["turn_text.offsets"])
    store = {"gran": t.get("gran"), "dense": {n: t[n] for n in names if n in t},
             "digest": t.get("slot_digest"), "turn_ptr": t.get("turn_ptr"),
             "turns": t.get("turns"), "turn_text": text, "lexical": lexical}
    for n in names:
        if n not in t:
            raise IndexFormatError(f"{where}: tensor {n!r}: missing")
    q_terms = ((t["lexical.q.indptr"], t["lexical.q.indices"], t["lexical.q.tf"])
               if lexical is not None and "lexical.q.indptr" in t else None)
    ids = [c["id"] for c in convs]
    questions = {"records": records, "conversations": [ids[i] for i in q_conv.tolist()],
                 "q_emb": t.get("q_emb"), "terms": q_terms}
    header = {"params": m.get("params"), "graphs": graphs, "config": m.get("config"),
              "tables": names, "lexical": lex, "signal_modules": m.get("signal_modules"),
              "generation": 0, "lsn": 0}
    return Parts(header, store, segments, questions)


def _checksums(where: str, t: dict, want) -> None:
    if want is None:
        return
    if not isinstance(want, dict):
        raise IndexFormatError(f"{where}: field 'tensor_crc32': expected an object")
    missing = sorted(set(want) ^ set(t))
    if missing:
        raise IndexFormatError(f"{where}: tensor {missing[0][:80]!r}: "
                               f"{'missing' if missing[0] in want else 'not listed'} in the "
                               "manifest's checksums (the file was changed after it was "
                               "written)")
    for name in sorted(t):
        if type(want[name]) is not int or _crc32(t[name]) != want[name]:
            raise IndexFormatError(f"{where}: tensor {name!r}: its contents differ from the "
                                   "CRC-32 checksum written with them (the file was changed "
                                   "or damaged after it was written); rebuild or restore "
                                   "the index")


def _version_2(folder: Path, top: dict) -> tuple[Parts, str]:
    name = top.get("current")
    if not isinstance(name, str) or not _VERSION_DIR.match(name):
        raise IndexFormatError(f"{folder / 'manifest.json'}: field 'current': expected 'v-' "
                               f"and 32 hex digits, got {json.dumps(name)[:80]}")
    mf = folder / name / "manifest.json"
    try:
        m, raw = read_json(mf)
    except NotADirectoryError:
        raise IndexFormatError(f"{folder / name}: the current version named by "
                               f"{folder / 'manifest.json'} is not a folder") from None
    if not isinstance(m, dict) or "current" in m:
        raise IndexFormatError(f"{mf}: not a version manifest")
    crc = top.get("manifest_crc32")
    if crc is not None and (type(crc) is not int or zlib.crc32(raw) != crc):
        raise IndexFormatError(f"{mf}: its contents differ from the CRC-32 checksum the "
                               "folder's pointer recorded when it was written (the file was "
                               "edited or damaged); rebuild or restore the index")
    t = _load_tensors(folder / name / "tensors.safetensors")
    _checksums(str(mf.with_name("tensors.safetensors")), t, m.get("tensor_crc32"))
    return _packed_parts(str(mf), m, t), name


# ---------------------------------------------------------------------------- version 3
def _load_file(folder: Path, entry: dict) -> tuple[dict, dict]:
    from safetensors.torch import load

    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or \
            not _DATA.match(entry["file"].split("/", 1)[-1]):
        raise IndexFormatError(f"{folder}: a checkpoint entry that names no data file")
    path = folder / entry["file"]
    raw = files.read_file(path, 1 << 40)
    if zlib.crc32(raw) != entry.get("crc"):
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


def _version_3(folder: Path, top: dict) -> tuple[Parts, str]:
    name = top.get("current")
    if not isinstance(name, str) or not _CKPT.match(name):
        raise IndexFormatError(f"{folder / 'manifest.json'}: field 'current': expected "
                               f"'ckpt-' and 32 hex digits, got {json.dumps(name)[:80]}")
    mf = folder / name
    m, raw = read_json(mf)
    if top.get("manifest_crc32") is not None and zlib.crc32(raw) != top["manifest_crc32"]:
        raise IndexFormatError(f"{mf}: its contents differ from the CRC-32 checksum the "
                               "folder's pointer recorded (the file was edited or damaged)")
    where = str(mf)
    chunks = _want(where, m, "chunks", list)
    entries = _want(where, m, "segments", list)
    if not chunks:
        raise IndexFormatError(f"{where}: field 'chunks': empty")
    parts, a = [], 0
    for c in chunks:
        x, _ = _load_file(folder, c)
        if c.get("slots", [None])[0] != a or "gran" not in x or \
                x["gran"].shape[0] != c["slots"][1] - c["slots"][0]:
            raise IndexFormatError(f"{where}: chunk {c.get('file')!r} does not follow the "
                                   "previous one")
        a = c["slots"][1]
        parts.append(x)
    store = store_of(parts)
    segments = []
    for e in entries:
        x, meta = _load_file(folder, e)
        graphs = {k[6:-7]: (x[k], x.get(k[:-7] + ".indices")) for k in x
                  if k.startswith("graph.") and k.endswith(".indptr")}
        segments.append((meta, x.get("slots"), x.get("days"), graphs))
    base, _ = _load_file(folder, _want(where, m, "base", dict))
    questions = {"records": m.get("questions"),
                 "conversations": m.get("question_conversations"), "q_emb": base.get("q_emb"),
                 "terms": (base["lexical.q.indptr"], base["lexical.q.indices"],
                           base["lexical.q.tf"]) if "lexical.q.indptr" in base else None}
    header = {k: m.get(k) for k in ("params", "graphs", "config", "tables", "lexical",
                                    "signal_modules")}
    header["generation"], header["lsn"] = int(m.get("generation") or 0), \
        _want(where, m, "lsn", int)
    return Parts(header, store, segments, questions), name


# ---------------------------------------------------------------------------- one reader
def read_legacy(folder, top: dict) -> tuple[Parts, str]:
    """The parts of a folder of format 1, 2 or 3 whose top ``manifest.json`` is ``top``,
    and the name of what was read (its version or checkpoint); a format-3 folder's
    records after its checkpoint (``parts.header["lsn"]``) are in its log.

    Raises:
        IndexFormatError: a damaged or inconsistent folder (one line naming the file).
        FileNotFoundError: a file a writer removed meanwhile (read again).
    """
    folder = Path(folder)
    version = top.get("version")
    if version == 3:
        return _version_3(folder, top)
    if "current" in top:
        return _version_2(folder, top)
    t = _load_tensors(folder / "tensors.safetensors")  # version 1
    _checksums(str(folder / "tensors.safetensors"), t, top.get("tensor_crc32"))
    return _packed_parts(str(folder / "manifest.json"), top, t), LEGACY_VERSION


def legacy_files(folder) -> list:
    """The files and folders of formats 1 to 3 in ``folder`` (removed once a format-4
    commit replaced them)."""
    folder = Path(folder)
    out = [p for p in folder.iterdir()
           if _VERSION_DIR.match(p.name) or _CKPT.match(p.name)
           or p.name == "tensors.safetensors" or p.name.startswith(".tmp-v-")]
    data = folder / "data"
    if data.is_dir():
        out += [p for p in data.iterdir() if _DATA.match(p.name)]
    lock = folder / "wal" / ".lock"
    if lock.exists():
        out.append(lock)
    return out


def remove_legacy(folder) -> None:
    """Remove :func:`legacy_files` (folders recursively), fsyncing what held them."""
    import shutil

    paths = legacy_files(folder)
    dirs = [p for p in paths if p.is_dir() and not p.is_symlink()]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    files.remove([p for p in paths if p not in dirs])
    if dirs:
        files.sync_dir(folder)
