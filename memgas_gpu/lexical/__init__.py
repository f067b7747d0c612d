"""Lexical (BM25) signals: tokenizer, term matrices, batched BM25 over a memory index."""
from ..ops.bm25 import (BM25_METHODS, BM25Postings, bm25_dense, bm25_gather, bm25_postings,
                        bm25_scores, bm25_weights)
from .signals import BM25Params, GranularityPostings, lexical_postings, lexical_signals
from .terms import LEXICAL_GRANULARITIES, LexicalIndex, TermMatrix, build_lexical
from .tokenize import STOPWORDS, Tokenizer, Vocabulary

__all__ = ["BM25_METHODS", "BM25Postings", "bm25_dense", "bm25_gather", "bm25_postings",
           "bm25_scores", "bm25_weights", "BM25Params",
           "GranularityPostings", "lexical_postings", "lexical_signals",
           "LEXICAL_GRANULARITIES", "LexicalIndex", "build_lexical",
           "TermMatrix", "STOPWORDS", "Tokenizer", "Vocabulary"]
