"""The one owner of a memory index's derived data.

Everything a read derives from stored data — packed views of conversations, BM25
postings, lexical graphs, cue tables, graphs of other settings — lives in a
:class:`~memgas_gpu.memory.segments.View`, and this cache owns the views.  A view is
keyed by the versions of the segments it packs, so a write, which gives the
conversation it changes a new segment version, makes only the views of that
conversation stale; they are dropped at once (:meth:`ViewCache.forget`), every other
conversation keeps its derived data.  Only views of current segments are kept: a view
of an older state (a reader that started before a write) is built for its reader and
not cached.  The least recently used views are evicted
beyond ``max_views``.  Thread-safe: lookups and insertions are under a lock; two
threads that miss the same key may both build it (the same content; one is kept).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, Optional

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
        self._deps: dict = {}  # key -> the segment versions its view depends on
        self._by_version: dict = {}  # version -> keys of the views depending on it

    def get(self, key: tuple, versions: tuple, build: Callable[[], object],
            live: Optional[Callable[[], bool]] = None):
        """The view under ``key`` (built by ``build()`` on a miss); ``versions`` are the
        segment versions it depends on.  ``live()`` says whether they are still the
        current ones: a view built from segments a write replaced meanwhile (or read
        from an older state) is returned but not kept."""
        with self._lock:
            got = self._views.get(key)
            if got is not None:
                self._views.move_to_end(key)
                return got
        view = build()
        with self._lock:  # a writer publishes, then forgets under this lock
            if live is not None and not live():
                return view
            if key not in self._views:
                self._views[key] = view
                self._deps[key] = tuple(versions)
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
            self._deps.clear()
            self._by_version.clear()

    def __len__(self) -> int:
        return len(self._views)

    def stats(self) -> dict:
        """Sizes of the bookkeeping (bounded by ``max_views`` and their versions)."""
        with self._lock:
            return {"views": len(self._views),
                    "versions": len(self._by_version),
                    "links": sum(len(k) for k in self._by_version.values()),
                    "dependencies": sum(len(d) for d in self._deps.values())}

    def depends_on(self) -> set:
        """Every segment version a cached view depends on."""
        with self._lock:
            return {v for d in self._deps.values() for v in d}

    def _unlink(self, key: Hashable) -> None:
        for v in self._deps.pop(key, ()):
            keys = self._by_version.get(v)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_version[v]
