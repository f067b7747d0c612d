"""The one read path (signals → normalise → route → seeds → propagate → session
scores) over the views of a memory; methods are named presets of :class:`ReadParams`.
:class:`MemoryIndex` (the memory users hold, :mod:`memgas_gpu.memory`) is exported here
too.

The names below load on first use (PEP 562), so that the settings and the method names
(:mod:`.params`, :mod:`.presets`: what the command line reads) import without torch.
"""
from __future__ import annotations

import sys
import types

from .._lazy import lazy_exports

#: name → the submodule it comes from
_HOME = {
    "SessionTable": "..memory.embed", "embed_sessions": "..memory.embed",
    "encode_unique": "..memory.embed",
    "DEFAULT_METHOD": "presets", "HYBRID_SIGNALS": "presets",
    "HYBRID_EXTRACTIVE_SIGNALS": "presets", "METHODS": "presets", "PRESETS": "presets",
    "NonFiniteScoresError": "engine", "ReadParams": "params", "SettingsError": "params",
    "resolve": "engine", "EncoderMismatchError": "..memory.index", "BuildParams": "params",
    "GraphParams": "params", "MemoryIndex": "..memory.index",
    "IndexConflictError": "..storage.folder", "IndexFormatError": "..storage.validate",
    "IndexLockError": "..storage.lock", "Retrieval": "search",
    "SearchResult": "results", "retrieve": "search", "search": "search", "SIGNALS": "signals",
    "QueryBatch": "signals", "SearchRequest": "search",
}

__all__ = list(_HOME)


class _Package(types.ModuleType):
    """``memgas_gpu.retrieve.search`` is the function :func:`.search.search`: importing
    the submodule of the same name must not rebind it to the module (the import system
    sets a package's attribute to each submodule it loads)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _HOME and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__getattr__, __dir__ = lazy_exports(__name__, _HOME)
