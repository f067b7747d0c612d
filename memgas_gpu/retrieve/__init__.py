"""The memory index and its one read path (signals → normalise → route → seeds →
propagate → session scores); methods are named presets of :class:`ReadParams`."""
from .embed import SessionTable, embed_sessions, encode_unique
from .engine import (DEFAULT_METHOD, HYBRID_EXTRACTIVE_SIGNALS, HYBRID_SIGNALS, METHODS,
                     PRESETS, NonFiniteScoresError, ReadParams, SettingsError, resolve)
from .index import BuildParams, EncoderMismatchError, GraphParams, MemoryIndex
from .persist import IndexConflictError, IndexFormatError, IndexLockError
from .search import Retrieval, SearchResult, retrieve, search
from .signals import SIGNALS, QueryBatch

__all__ = ["SessionTable", "embed_sessions", "encode_unique", "DEFAULT_METHOD", "HYBRID_SIGNALS",
           "HYBRID_EXTRACTIVE_SIGNALS", "METHODS", "PRESETS", "NonFiniteScoresError", "ReadParams",
           "SettingsError", "resolve", "EncoderMismatchError", "BuildParams", "GraphParams",
           "MemoryIndex", "IndexConflictError", "IndexFormatError", "IndexLockError",
           "Retrieval", "SearchResult", "retrieve", "search", "SIGNALS", "QueryBatch"]
