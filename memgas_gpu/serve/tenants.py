"""API keys and tenants of ``memgas serve``.

A keys file maps each key to the tenant it speaks for, as one JSON object::

    {"9c1d0d6e7b2f4a51a3f0c8e2d4b6a8c0": "alice",
     "1f7e3b5d9a2c4e6f8b0d2f4a6c8e0a2b": "bob"}

(several keys may name the same tenant: rotate a key by adding the new one first).
``MEMGAS_API_KEYS`` may hold the same JSON instead of a file.  Keys are at least
:data:`MIN_KEY_CHARS` characters without whitespace; tenant names are 1 to 64 letters,
digits, ``.``, ``_`` or ``-`` (no ``/``).  No message, log line or metric ever shows a
key; errors about an entry name its position and tenant.

Every conversation belongs to one tenant: tenant ``alice``'s conversation ``c1`` is the
memory's conversation ``alice/c1``.  A tenant name holds no ``/``, so the first ``/`` of
a memory id ends its tenant: whatever ``c1`` holds (``bob/x`` included), ``alice/...``
is never another tenant's id.  Without keys there are no tenants and the API's ids are
the memory's own.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
from pathlib import Path
from typing import Optional

from ..errors import MemgasError

__all__ = ["KeyRing", "KeyFileError", "load_keys", "qualify", "unqualify", "owns",
           "MIN_KEY_CHARS", "TENANT_RE", "ENV_KEYS"]

#: the environment variable that may hold the keys (JSON) instead of ``--keys FILE``
ENV_KEYS = "MEMGAS_API_KEYS"
MIN_KEY_CHARS = 16
TENANT_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
SEP = "/"


class KeyFileError(MemgasError, ValueError):
    """A keys file (or ``MEMGAS_API_KEYS``) that is not a valid key → tenant map; the
    message names the entry, never the key."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """Key → tenant lookups; only the SHA-256 of each key is kept."""

    def __init__(self, mapping: dict) -> None:
        self._by_digest = {_digest(k): t for k, t in mapping.items()}
        self.tenants = sorted(set(mapping.values()))

    def tenant(self, key: Optional[str]) -> Optional[str]:
        """The tenant of ``key``, None when it is not one of the keys."""
        if not key:
            return None
        d = _digest(key)
        for known, tenant in self._by_digest.items():  # compare every digest: no early out
            if hmac.compare_digest(known, d):
                return tenant
        return None

    def __len__(self) -> int:
        return len(self._by_digest)

    def __repr__(self) -> str:  # never the keys
        return f"KeyRing({len(self)} keys, tenants {self.tenants})"


def parse_keys(text: str, where: str) -> KeyRing:
    """The :class:`KeyRing` of a keys JSON text (``where``: its file or variable name,
    for messages)."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise KeyFileError(f"{where}: not JSON ({e.msg} at line {e.lineno}); expected an "
                           'object {"KEY": "tenant", ...}') from None
    if not isinstance(data, dict) or not data:
        raise KeyFileError(f'{where}: expected a non-empty JSON object {{"KEY": "tenant", '
                           f"...}}, got {type(data).__name__ if data else 'nothing'}")
    for i, (key, tenant) in enumerate(data.items()):
        entry = f"{where}: entry {i + 1}"
        if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
            raise KeyFileError(f"{entry}: the tenant must be 1 to 64 letters, digits, '.', "
                               f"'_' or '-', got {tenant!r:.80}")
        if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key) or not key.isprintable():
            raise KeyFileError(f"{entry} (tenant {tenant!r}): the key must be at least "
                               f"{MIN_KEY_CHARS} printable characters without whitespace "
                               "(e.g. python -c 'import secrets; print(secrets.token_hex(16))')")
    return KeyRing(data)


def load_keys(path: Optional[str] = None, environ: Optional[dict] = None
              ) -> tuple[Optional[KeyRing], Optional[str]]:
    """``(keys, warning)`` from the file ``path``, else from ``MEMGAS_API_KEYS``, else
    ``(None, None)`` (no keys: no tenants).  The warning says when the file is readable
    by other users."""
    env = os.environ if environ is None else environ
    if path is None:
        text = env.get(ENV_KEYS)
        if text is None or not text.strip():
            return None, None
        return parse_keys(text, ENV_KEYS), None
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        mode = p.stat().st_mode
    except OSError as e:
        raise KeyFileError(f"{path}: cannot read the keys file ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: the keys file is not UTF-8 text") from None
    warning = None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warning = (f"{path} is readable by other users; chmod 600 it to keep the keys "
                   "private")
    return parse_keys(text, str(path)), warning


# ------------------------------------------------------------------ tenant-qualified ids
def qualify(tenant: Optional[str], conversation_id: str) -> str:
    """The memory's id of ``tenant``'s conversation ``conversation_id`` (the id itself
    without tenants)."""
    return conversation_id if tenant is None else f"{tenant}{SEP}{conversation_id}"


def owns(tenant: Optional[str], memory_id: str) -> bool:
    """Whether the memory's conversation ``memory_id`` is ``tenant``'s."""
    return tenant is None or memory_id.startswith(tenant + SEP)


def unqualify(tenant: Optional[str], memory_id: str) -> str:
    """``tenant``'s id of its conversation ``memory_id`` (see :func:`owns`)."""
    if tenant is None:
        return memory_id
    if not owns(tenant, memory_id):
        raise ValueError(f"{memory_id!r} is not a conversation of tenant {tenant!r}")
    return memory_id[len(tenant) + len(SEP):]
