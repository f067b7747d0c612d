"""Granularity texts: summaries and keywords from offline, shipped, file or LLM sources."""
from .expansion import Expansion, expand_dataset
from .offline import OfflineExtractor
from .sources import (DatasetSummarySource, JsonlSource, OfflineSource, TextSource,
                      describe_source, reference_key, resolve_source)

__all__ = ["Expansion", "expand_dataset", "OfflineExtractor",
           "DatasetSummarySource", "JsonlSource", "OfflineSource", "TextSource",
           "describe_source", "reference_key", "resolve_source"]
