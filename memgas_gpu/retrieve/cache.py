"""The one owner of a memory index's derived data.

Everything a read derives from stored data — packed views of conversations, BM25
postings, lexical graphs, cue tables, graphs of other settings — lives in a
:class:`~memgas_gpu.retrieve.segments.View`, and this cache owns the views.  A view is
keyed by the versions of the segments it packs, so a write, which gives the
conversation it changes a new segment version, makes only the views of that
conversation stale; they are dropped at once (:meth:`ViewCache.forget`), every other
conversation keeps its derived data.  The least recently used views are evicted
beyond ``max_views``.  Thread-safe: lookups and insertions are under a lock; two
threads that miss the same key may both build it (the same content; one is kept).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

__all__ = ["ViewCache", "DEFAULT_MAX_VIEWS"]

#: views kept (each one conversation, or the conversations of one batch)
DEFAULT_MAX_VIEWS = 256


class ViewCache:
    """LRU of views keyed by ``(kind, segment versions...)``."""

    def __init__(self, max_views: int = DEFAULT_MAX_VIEWS) -> None:
        if isinstance(max_views, bool) or not isinstance(max_views, int) or max_views < 1:
            raise ValueError(f"max_views must be an integer >= 1, got {max_views!r}")
        self.max_views = max_views
        self._lock = threading.Lock()
        self._views: OrderedDict = OrderedDict()
        self._by_version: dict = {}

    def get(self, key: tuple, versions: tuple, build: Callable[[], object]):
        """The view under ``key`` (built by ``build()`` on a miss); ``versions`` are the
        segment versions it depends on."""
        with self._lock:
            got = self._views.get(key)
            if got is not None:
                self._views.move_to_end(key)
                return got
        view = build()
        with self._lock:
            if key not in self._views:
                self._views[key] = view
                for v in versions:
                    self._by_version.setdefault(v, set()).add(key)
                while len(self._views) > self.max_views:
                    old, _ = self._views.popitem(last=False)
                    self._unlink(old)
            return self._views[key]

    def forget(self, versions) -> None:
        """Drop every view that depends on one of ``versions`` (replaced segments)."""
        with self._lock:
            for v in versions:
                for key in self._by_version.pop(v, ()):
                    if self._views.pop(key, None) is not None:
                        self._unlink(key)

    def clear(self) -> None:
        with self._lock:
            self._views.clear()
            self._by_version.clear()

    def __len__(self) -> int:
        return len(self._views)

    def _unlink(self, key: Hashable) -> None:
        for v in key[1]:
            keys = self._by_version.get(v)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_version[v]
