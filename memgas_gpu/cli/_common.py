"""Options shared by several subcommands."""
from __future__ import annotations

import functools

import click

from ..data import FORMATS


def dataset_options(f):
    @click.option("--format", "fmt", type=click.Choice(("auto",) + FORMATS), default="auto",
                  show_default=True, help="Input format of DATA.")
    @click.option("--empty-sessions", type=click.Choice(("error", "keep", "drop")),
                  default="error", show_default=True, help="What to do with empty sessions.")
    @click.option("--user-only", is_flag=True,
                  help="LongMemEval: index user messages only (MemGAS indexes both roles).")
    @functools.wraps(f)
    def wrapper(*a, **k):
        return f(*a, **k)
    return wrapper


def build_options(f):
    @click.option("--encoder", default=None, metavar="MODEL",
                  help="Hugging Face encoder name or local folder "
                       "[default: bundled all-MiniLM-L6-v2, offline].")
    @click.option("--pooling", type=click.Choice(("mean", "cls")), default="mean",
                  show_default=True)
    @click.option("--max-length", type=int, default=None,
                  help="Tokens per text (longer texts are truncated) [default: the "
                       "model's sentence-transformers max_seq_length, else 512].")
    @click.option("--summaries", default="offline", show_default=True, metavar="SRC",
                  help="'offline', 'source' (LoCoMo's own) or a MemGAS .jsonl file.")
    @click.option("--keywords", default="offline", show_default=True, metavar="SRC",
                  help="'offline' or a MemGAS .jsonl file.")
    @click.option("--store", type=click.Path(file_okay=False), default=None,
                  help="Embedding store folder: resumable, shared across runs.")
    @click.option("--m", "m", type=click.IntRange(2), default=30, show_default=True,
                  help="Candidates per node for the GMM association test.")
    @click.option("--skip-sessions", type=click.IntRange(0), default=5, show_default=True,
                  help="The first sessions get no outgoing edges.")
    @click.option("--no-hybrid", is_flag=True, help="Skip the hybrid-text baseline embeddings.")
    @click.option("--device", default=None, help="cpu, cuda, cuda:1 … [default: auto].")
    @functools.wraps(f)
    def wrapper(*a, **k):
        return f(*a, **k)
    return wrapper


def build_index(data, fmt, empty_sessions, user_only, encoder, pooling, max_length,
                summaries, keywords, store, m, skip_sessions, no_hybrid, device):
    """Load DATA and build a MemoryIndex with the CLI's options."""
    from ..data import load_dataset
    from ..encode import EmbeddingStore, Encoder
    from ..retrieve import MemoryIndex

    ds = load_dataset(data, fmt, empty_sessions=empty_sessions, user_only=user_only,
                      progress=True)
    enc = Encoder(encoder, pooling=pooling, max_length=max_length, device=device)
    st = EmbeddingStore(store, enc.fingerprint) if store else None
    click.echo(f"indexing {len(ds)} conversations, {len(ds.distinct_sessions())} distinct "
               f"sessions, {len(ds.questions)} questions with {enc.describe()['model']} "
               f"on {enc.device}", err=True)
    return MemoryIndex.build(ds, enc, summaries=summaries, keywords=keywords, store=st,
                             m=m, skip_sessions=skip_sessions, hybrid=not no_hybrid,
                             device=device, progress=True)
