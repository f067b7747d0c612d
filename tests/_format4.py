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


def pack_sizes(folder) -> dict:
    """``{pack id: bytes}`` of the packs in the folder."""
    d = Path(folder) / "data"
    return {int(p.stem): p.stat().st_size for p in d.glob("*.pack")} if d.is_dir() else {}


def folder_bytes(folder) -> dict:
    """``{relative path: bytes}`` of every file of the folder."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}
