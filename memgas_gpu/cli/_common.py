"""Options shared by several subcommands."""
from __future__ import annotations

import functools

import click

from ..data import FORMATS


def _id_list(ctx, param, value):
    if value is None:
        return None
    ids = [v.strip() for v in value.split(",") if v.strip()]
    if not ids:
        raise click.BadParameter("give at least one conversation id", param=param)
    return ids


def load(data, fmt="auto", empty_sessions="error", user_only=False, conversations=None,
         exclude_conversations=None, progress=True):
    """``load_dataset`` with the dataset options; an unknown id is a usage error."""
    from ..data import load_dataset

    try:
        return load_dataset(data, fmt, empty_sessions=empty_sessions, user_only=user_only,
                            progress=progress, conversations=conversations,
                            exclude=exclude_conversations)
    except ValueError as e:
        if type(e) is not ValueError:  # DataFormatError keeps its own exit path
            raise
        raise click.UsageError(str(e)) from None


def dataset_options(f):
    @click.option("--format", "fmt", type=click.Choice(("auto",) + FORMATS), default="auto",
                  show_default=True, help="Input format of DATA.")
    @click.option("--empty-sessions", type=click.Choice(("error", "keep", "drop")),
                  default="error", show_default=True, help="What to do with empty sessions.")
    @click.option("--user-only", is_flag=True,
                  help="LongMemEval: index user messages only (MemGAS indexes both roles).")
    @click.option("--conversations", default=None, metavar="IDS", callback=_id_list,
                  help="Use only these conversation ids (comma-separated).")
    @click.option("--exclude-conversations", default=None, metavar="IDS", callback=_id_list,
                  help="Drop these conversation ids (comma-separated), e.g. "
                       "conv-26,conv-30,conv-41 to evaluate LoCoMo without its dev set.")
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
    @click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
                  metavar="[ADDRESS]",
                  help="Run on Ray: a local instance (--ray alone) or a cluster address "
                       "('auto', 'ray://host:10001').")
    @click.option("--workers", type=click.IntRange(1), default=2, show_default=True,
                  help="With --ray: encoder actors and evaluation tasks.")
    @click.option("--gpus-per-worker", type=click.FloatRange(0), default=0.0,
                  show_default=True, help="With --ray: GPUs per encoder actor (1 = one per GPU).")
    @click.option("--quiet", "-q", is_flag=True,
                  help="No progress output (by default: a bar on a terminal, a plain "
                       "line every few seconds in a log).")
    @functools.wraps(f)
    def wrapper(*a, **k):
        return f(*a, **k)
    return wrapper


def ray_or_exit(address):
    """Start/connect Ray, or stop with the install command when it is missing."""
    from ..distributed import init_ray  # imports ray lazily

    try:
        return init_ray(address)
    except ImportError as e:
        raise click.UsageError(str(e)) from None


def build_index(data, fmt, empty_sessions, user_only, encoder, pooling, max_length,
                summaries, keywords, store, m, skip_sessions, no_hybrid, device,
                ray_address=None, workers=2, gpus_per_worker=0.0, conversations=None,
                exclude_conversations=None, dataset=None, quiet=False):
    """Load DATA (unless ``dataset`` is already loaded from it) and build a MemoryIndex
    with the CLI's options; ``quiet`` silences progress and the stderr summary."""
    from ..progress import quiet as quiet_scope

    with quiet_scope(quiet):
        return _build_index(data, fmt, empty_sessions, user_only, encoder, pooling,
                            max_length, summaries, keywords, store, m, skip_sessions,
                            no_hybrid, device, ray_address, workers, gpus_per_worker,
                            conversations, exclude_conversations, dataset, quiet)


def _build_index(data, fmt, empty_sessions, user_only, encoder, pooling, max_length,
                 summaries, keywords, store, m, skip_sessions, no_hybrid, device,
                 ray_address, workers, gpus_per_worker, conversations,
                 exclude_conversations, dataset, quiet):
    from ..encode import EmbeddingStore, Encoder
    from ..retrieve import MemoryIndex

    say = (lambda msg: None) if quiet else (lambda msg: click.echo(msg, err=True))
    ds = dataset if dataset is not None else load(data, fmt, empty_sessions, user_only,
                                                  conversations, exclude_conversations)
    if ray_address:
        ray_or_exit(ray_address)
        from ..distributed import build_index_ray

        kwargs = {"model": encoder, "pooling": pooling, "max_length": max_length}
        if device:
            kwargs["device"] = device
        say(f"indexing {len(ds)} conversations on Ray ({workers} encoder actors)")
        return build_index_ray(ds, kwargs, num_workers=workers, num_gpus=gpus_per_worker,
                               store_dir=store, summaries=summaries, keywords=keywords, m=m,
                               skip_sessions=skip_sessions, hybrid=not no_hybrid,
                               device=device, progress=True)
    enc = Encoder(encoder, pooling=pooling, max_length=max_length, device=device)
    st = EmbeddingStore(store, enc.fingerprint) if store else None
    say(f"indexing {len(ds)} conversations, {len(ds.distinct_sessions())} distinct "
        f"sessions, {len(ds.questions)} questions with {enc.describe()['model']} "
        f"on {enc.device}")
    return MemoryIndex.build(ds, enc, summaries=summaries, keywords=keywords, store=st,
                             m=m, skip_sessions=skip_sessions, hybrid=not no_hybrid,
                             device=device, progress=True)
