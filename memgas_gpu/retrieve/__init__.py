"""The MemGAS pipeline: a packed index of many conversations and batched retrieval."""
from .embed import SessionTable, embed_sessions, encode_unique
from .index import GraphParams, MemoryIndex
from .search import METHODS, Retrieval, SearchParams, retrieve

__all__ = ["SessionTable", "embed_sessions", "encode_unique", "GraphParams", "MemoryIndex",
           "METHODS", "Retrieval", "SearchParams", "retrieve"]
