"""The memory users hold: :class:`MemoryIndex` — its state (segments, the session store,
published states and the views the read path runs on), its writes, its derived-data
cache — and :class:`DurableMemory`, a memory kept in a folder (writes logged before
they return, checkpoints, recovery, followers).

The names below load on first use (PEP 562): importing the package imports no torch.
"""
from __future__ import annotations

from .._lazy import lazy_exports

#: name → the submodule it comes from
_HOME = {"MemoryIndex": "index", "EncoderMismatchError": "index",
         "DurableMemory": "index", "DurableParams": "durable", "ConversationMeta": "meta"}

__all__ = list(_HOME)

__getattr__, __dir__ = lazy_exports(__name__, _HOME)
