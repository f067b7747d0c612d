"""Packs: the append-only files of a memory's folder, and the blobs in them.

A pack (``DIR/data/NNNNNNNN.pack``) starts with a 24-byte header (``MGAS-PCK``, format
version u32, pack number u64, CRC-32 of those 20 bytes) and then holds blobs end to
end; a blob is named by a *ref* ``[pack, offset, length, crc32]``, and the bytes a ref
names never change.  :class:`PackWriter` appends a commit's blobs (to the last pack, or
a new one) and takes them back when the commit fails; :class:`PackReader` reads blobs
by ref, checking each pack's header and each blob's CRC-32, refusing what is not a
regular file before it could block, and what is too large before it is read.
:mod:`.commit` says what the blobs are.
"""
from __future__ import annotations

import json
import os
import re
import stat
import struct
import zlib
from pathlib import Path
from typing import Optional

from .._io import json_loads
from . import files
from .validate import IndexFormatError

__all__ = ["PackWriter", "PackReader", "pack_name", "pack_files", "tensor_blob",
           "json_blob", "PACK_BYTES", "PACK_HEADER_BYTES", "MAX_JSON_BYTES", "DATA"]

DATA = "data"

#: a pack past this size is closed: the next commit starts a new one
PACK_BYTES = 256 << 20
#: a commit's blobs are written in runs of about this many bytes (one write each: a
#: commit of many small blobs, the reference counts' leaves and nodes, costs a few
#: writes, not one per blob)
WRITE_BYTES = 1 << 20
_PACK_MAGIC = b"MGAS-PCK"
_PACK_HEAD = struct.Struct("<8sIQ")
PACK_HEADER_BYTES = _PACK_HEAD.size + 4
_PACK_NAME = re.compile(r"^([0-9]{8})\.pack$")
#: largest root, page or pointer read (settings and questions' records; a directory
#: page of ~10,000 conversations)
MAX_JSON_BYTES = 64 << 20
MAX_BLOB_BYTES = 1 << 34


def pack_name(pack: int) -> str:
    return f"{DATA}/{pack:08d}.pack"


def pack_files(folder: Path) -> dict:
    """``{pack id: path}`` of the packs in ``folder/data``."""
    d = Path(folder) / DATA
    out = {}
    if d.is_dir():
        for p in d.iterdir():
            m = _PACK_NAME.match(p.name)
            if m:
                out[int(m.group(1))] = p
    return out


def tensor_blob(tensors: dict, meta: Optional[dict] = None) -> bytes:
    """A safetensors blob of ``tensors`` with ``meta`` as its ``memgas`` metadata."""
    from safetensors.torch import save

    return save({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                metadata={"memgas": json.dumps(meta or {}, ensure_ascii=False,
                                               allow_nan=False)})


def json_blob(value) -> bytes:
    """A JSON blob (strict: no NaN; compact)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")


class PackWriter:
    """Appends blobs to the folder's last pack (or a new one) and tracks each pack's
    live bytes."""

    def __init__(self, folder: Path, packs: dict, new_pack: bool) -> None:
        self.folder = folder
        self.packs = {int(k): dict(v) for k, v in packs.items()}
        self.fd = -1
        self.pack = max(self.packs) if self.packs else 0
        self.start = 0
        if new_pack or not self.packs or self.packs[self.pack]["end"] >= PACK_BYTES:
            self._new()
        else:
            self.path = folder / pack_name(self.pack)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            self.start = self.end = self.packs[self.pack]["end"]
        self.written = 0
        self.pending = bytearray()  # blobs put, not written yet, from pending_at
        self.pending_at = self.end

    created: Optional[int] = None

    def _new(self) -> None:
        self.pack = max([0, *self.packs, *pack_files(self.folder)]) + 1
        self.path = self.folder / pack_name(self.pack)
        head = _PACK_HEAD.pack(_PACK_MAGIC, 1, self.pack)
        files.write_new(self.path, head + struct.pack("<I", zlib.crc32(head)), "a new pack")
        files.sync_dir(self.path.parent)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        self.start = self.end = PACK_HEADER_BYTES
        self.packs[self.pack] = {"end": self.end, "live": 0}
        self.created = self.pack

    def put(self, data: bytes) -> list:
        """Append ``data`` (written with the next run, at the latest by :meth:`sync`)."""
        if len(data) >= WRITE_BYTES:  # a large blob: written as it is
            self.flush()
            files.append_at(self.fd, data, self.end, self.path, "a commit")
        else:
            if not self.pending:
                self.pending_at = self.end
            self.pending += data
            if len(self.pending) >= WRITE_BYTES:
                self.flush()
        ref = [self.pack, self.end, len(data), zlib.crc32(data)]
        self.end += len(data)
        self.written += len(data)
        p = self.packs[self.pack]
        p["end"], p["live"] = self.end, p["live"] + len(data)
        return ref

    def drop(self, ref: Optional[list]) -> None:
        """A blob no longer named by the commit being written (its bytes are garbage)."""
        if ref is not None and ref[0] in self.packs:
            self.packs[ref[0]]["live"] -= ref[2]

    def flush(self) -> None:
        """Write the blobs put since the last run (not fsync'd)."""
        if self.pending:
            files.append_at(self.fd, self.pending, self.pending_at, self.path, "a commit")
            self.pending = bytearray()

    def sync(self) -> None:
        self.flush()
        os.fsync(self.fd)

    def close(self, failed: bool = False) -> None:
        """Close the pack; ``failed``: take back what this commit appended (the pack it
        created removed, or the last one cut back), best effort."""
        if not failed:
            self.flush()
        self.pending = bytearray()
        if self.fd >= 0:
            if failed and self.created is None:
                try:
                    os.ftruncate(self.fd, self.start)
                except OSError:
                    pass
            os.close(self.fd)
            self.fd = -1
        if failed and self.created is not None:
            try:
                files.remove([self.path])
            except OSError:
                pass


def _no_surrogate(where: str, value, text: str):
    """``value`` (parsed from the JSON ``text``), refused when a string of it holds a lone
    UTF-16 surrogate (an escape JSON allows, not valid Unicode text)."""
    from .._io import find_surrogate, may_hold_surrogate

    bad = find_surrogate(value) if may_hold_surrogate(text) else None
    if bad is not None:
        raise IndexFormatError(f"{where}: field {bad!r}: a lone UTF-16 surrogate escape (not "
                               "valid Unicode text)")
    return value


class PackReader:
    """Reads blobs by ref (CRC-32 checked), keeping each pack open while it reads."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.fds: dict = {}

    def get(self, ref, what: str) -> bytes:
        if (not isinstance(ref, list) or len(ref) != 4
                or not all(type(x) is int and x >= 0 for x in ref)
                or ref[2] > MAX_BLOB_BYTES):
            raise IndexFormatError(f"{self.folder}: {what}: not a blob reference "
                                   f"({json.dumps(ref)[:80]})")
        pack, off, n, crc = ref
        fd = self.fds.get(pack)
        path = self.folder / pack_name(pack)
        if fd is None:
            try:  # O_NONBLOCK: a FIFO must not block the reader (refused below)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except NotADirectoryError:  # FileNotFoundError: retried by the caller
                raise IndexFormatError(f"{path.parent}: not a folder") from None
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                raise IndexFormatError(f"{path}: " + ("a folder, not a file" if stat.S_ISDIR(mode)
                                                      else "not a regular file"))
            head = os.pread(fd, PACK_HEADER_BYTES, 0)
            if len(head) < PACK_HEADER_BYTES or head[:8] != _PACK_MAGIC or \
                    zlib.crc32(head[:_PACK_HEAD.size]) != \
                    struct.unpack_from("<I", head, _PACK_HEAD.size)[0] or \
                    _PACK_HEAD.unpack_from(head)[2] != pack:
                os.close(fd)
                raise IndexFormatError(f"{path}: offset 0: not the header of pack {pack} (a "
                                       "damaged or foreign file)")
            self.fds[pack] = fd
        parts, got = [], 0
        while got < n:
            b = os.pread(fd, n - got, off + got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        data = b"".join(parts)
        if len(data) != n:
            raise IndexFormatError(f"{path}: offset {off}: {what} is cut short ({len(data)} of "
                                   f"{n} bytes)")
        if zlib.crc32(data) != crc:
            raise IndexFormatError(f"{path}: offset {off}: {what} differs from the CRC-32 "
                                   "checksum its commit recorded (the file was changed or "
                                   "damaged)")
        return data

    def json(self, ref, what: str):
        if isinstance(ref, list) and len(ref) == 4 and type(ref[2]) is int and \
                ref[2] > MAX_JSON_BYTES and type(ref[0]) is int and type(ref[1]) is int:
            # refused from its size before it is read (a sparse pack holds any length)
            raise IndexFormatError(f"{self.folder / pack_name(ref[0])}: offset {ref[1]}: "
                                   f"{what}: {ref[2]} bytes, more than the {MAX_JSON_BYTES} "
                                   "accepted")
        data = self.get(ref, what)
        where = f"{self.folder / pack_name(ref[0])}: offset {ref[1]}: {what}"
        try:
            text = data.decode("utf-8")
            return _no_surrogate(where, json_loads(text), text)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise IndexFormatError(f"{where}: not JSON ({type(e).__name__}: "
                                   f"{' '.join(str(e).split())[:120]})") from None

    def tensors(self, ref, what: str) -> tuple[dict, dict]:
        from safetensors.torch import load

        data = self.get(ref, what)
        where = f"{self.folder / pack_name(ref[0])}: offset {ref[1]}: {what}"
        try:
            tensors = load(data)
            n = int.from_bytes(data[:8], "little")
            text = json_loads(data[8:8 + n])["__metadata__"]["memgas"]
            meta = json_loads(text)
        except Exception as e:  # noqa: BLE001 - safetensors' and json's errors
            raise IndexFormatError(f"{where}: unreadable ({type(e).__name__}: "
                                   f"{' '.join(str(e).split())[:160]})") from None
        if not isinstance(meta, dict):
            raise IndexFormatError(f"{where}: its metadata is not an object")
        return tensors, _no_surrogate(where, meta, text)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
