"""Options shared by several subcommands."""
from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Optional

import click

from ..data import FORMATS
from ..errors import MemgasError
from ..progress import is_quiet
from ..progress import quiet as quiet_scope
from ..retrieve.params import BuildParams, ReadParams  # settings and methods: no torch
from ..retrieve.presets import DEFAULT_METHOD


class FiniteFloat(click.ParamType):
    """A float option that refuses NaN and ±inf (``click.FloatRange`` lets NaN through:
    every comparison with NaN is False) and, optionally, values outside a range.

    Args:
        min, max: bounds (None: unbounded on that side).
        min_open, max_open: exclude the bound itself.
    """

    name = "float"

    def __init__(self, min: Optional[float] = None, max: Optional[float] = None,
                 min_open: bool = False, max_open: bool = False) -> None:
        self.min, self.max, self.min_open, self.max_open = min, max, min_open, max_open

    def describe(self) -> str:
        """The accepted range, e.g. ``0 < x <= 1`` (also shown in ``--help``)."""
        lo = "" if self.min is None else f"{self.min:g} {'<' if self.min_open else '<='} "
        hi = "" if self.max is None else f" {'<' if self.max_open else '<='} {self.max:g}"
        return f"{lo}x{hi}" if lo or hi else "a finite number"

    def check(self, value) -> Optional[str]:
        """None if ``value`` is accepted, else why not (one phrase)."""
        try:
            x = float(value)
        except (TypeError, ValueError):
            return f"{value!r} is not a number"
        if not math.isfinite(x):
            return f"{value!r} is not a finite number"
        if self.min is not None and (x < self.min or (self.min_open and x == self.min)) or \
                self.max is not None and (x > self.max or (self.max_open and x == self.max)):
            return f"{value!r} is not in the range {self.describe()}"
        return None

    def convert(self, value, param, ctx):
        why = self.check(value)
        if why is not None:
            self.fail(why, param, ctx)
        return float(value)

    def get_metavar(self, param, ctx=None) -> str:  # click 8.1 and 8.2 signatures
        return "FLOAT"

    def __repr__(self) -> str:
        return f"FiniteFloat({self.describe()})"


class PathArg(click.Path):
    """``click.Path`` that also refuses an empty path: ``--out ""`` silently meant "no
    output", and ``index --out ""`` the current folder."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value:
            self.fail("an empty path", param, ctx)
        return super().convert(value, param, ctx)


def setting_type(cls, name: str) -> click.ParamType:
    """The option type of field ``name`` of the settings class ``cls`` (a
    :class:`~memgas_gpu.settings.Settings`), from its spec: an integer or a finite number
    within its bounds, or one of its choices."""
    spec = cls.specs()[name]
    if spec.kind == "int":
        return click.IntRange(spec.lo, spec.hi)
    if spec.kind == "real" and spec.finite:
        return FiniteFloat(spec.lo, spec.hi, min_open=spec.lo_open)
    if spec.kind == "choice":
        return click.Choice(spec.choices)
    raise TypeError(f"{cls.__name__}.{name} ({spec.kind}) has no option type")


def info(msg: str) -> None:
    """A status line on stderr (what is being done, what was written), unless --quiet."""
    if not is_quiet():
        click.echo(msg, err=True)


def quiet_option(f):
    """``--quiet/-q``: no progress and no status lines on stderr (results and errors
    still print); the command runs inside :func:`memgas_gpu.progress.quiet`."""
    @click.option("--quiet", "-q", "quiet", is_flag=True,
                  help="No progress or status lines on stderr (by default: a bar on a "
                       "terminal, a plain line every few seconds in a log).")
    @functools.wraps(f)
    def wrapper(*a, quiet=False, **k):
        with quiet_scope(quiet):
            return f(*a, **k)
    return wrapper


def check_device(device: Optional[str]) -> Optional[str]:
    """``--device`` checked before any work: a name torch knows, on a machine that has
    it (one usage line otherwise); None and ``"auto"`` pass through."""
    if device is None or device == "auto":
        return device
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise click.BadParameter(f"{device!r} is not a device; use cpu, cuda or cuda:N",
                                 param_hint="--device") from None
    if dev.type == "cpu":
        return device
    if dev.type != "cuda":
        raise click.BadParameter(f"{device!r}: only cpu and cuda devices are supported",
                                 param_hint="--device")
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else \
            "no CUDA device visible"
        raise click.BadParameter(f"{device!r}: CUDA is not available on this machine "
                                 f"({build}); use --device cpu", param_hint="--device")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise click.BadParameter(f"{device!r}: this machine has "
                                 f"{torch.cuda.device_count()} CUDA device(s)",
                                 param_hint="--device")
    return device


def check_backend(device: Optional[str] = None) -> None:
    """``MEMGAS_BACKEND`` checked before any work (one usage line when it is unknown,
    or ``native`` without the native kernels for ``device``)."""
    raw = os.environ.get("MEMGAS_BACKEND", "")
    env = raw.strip().lower() or "auto"
    from .._native import BACKENDS, native_available

    if env not in BACKENDS:
        raise click.UsageError(f"MEMGAS_BACKEND={raw!r}: expected one of "
                               f"{', '.join(BACKENDS)}")
    if env == "native" and not native_available(device or "cpu"):
        raise click.UsageError("MEMGAS_BACKEND=native, but the native kernels for "
                               f"{device or 'cpu'} are not built (docs/native.md); "
                               "unset it or use MEMGAS_BACKEND=torch")


def check_runtime(device: Optional[str]) -> Optional[str]:
    """:func:`check_device` and :func:`check_backend`: what every computing command
    checks first."""
    device = check_device(device)
    check_backend(None if device in (None, "auto") else device)
    return device


def _writable_folder(path: Path, option: str, shown, parents: bool = False) -> None:
    """The folder ``path`` exists and accepts new files (a probe file is created and
    removed: permissions, read-only file systems, and root alike); with ``parents``,
    the nearest existing folder at or above it (the missing ones will be created)."""
    import tempfile

    d = path
    while parents and not d.exists():
        if d.parent == d:
            break
        d = d.parent
    if not d.exists():
        raise click.BadParameter(f"{shown}: the folder {d} does not exist (create it "
                                 "first)", param_hint=option)
    if not d.is_dir():
        raise click.BadParameter(f"{shown}: {d} is not a folder", param_hint=option)
    try:
        with tempfile.TemporaryFile(dir=d, prefix=".memgas-probe-"):
            pass
    except OSError as e:
        raise click.BadParameter(f"{shown}: cannot write in {d} "
                                 f"({e.strerror or e.__class__.__name__})",
                                 param_hint=option) from None


def check_out_file(path, option: str = "--out") -> None:
    """Refuse, before any work, an output file that could not be written (a folder, a
    parent folder that does not exist or is a file, a folder without write
    permission): one usage line."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise click.BadParameter(f"{path}: is a folder, expected a file name",
                                 param_hint=option)
    if p.exists() and not os.access(p, os.W_OK):
        raise click.BadParameter(f"{path}: not writable", param_hint=option)
    _writable_folder(p.parent if str(p.parent) else Path("."), option, path)


def check_out_dir(path, option: str = "--out", index: bool = False,
                  parents: bool = False) -> None:
    """Refuse, before any work, an output folder that could not be written (its parent
    does not exist, unless ``parents``: a cache folder, created with its parents); with
    ``index``, also one that saving an index would refuse (a file, a folder that is
    not an index)."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise click.BadParameter(f"{path}: exists and is not a folder", param_hint=option)
    if index:
        from ..storage.folder import check_target

        try:
            check_target(p)
        except (MemgasError, ValueError) as e:
            raise click.BadParameter(str(e), param_hint=option) from None
    _writable_folder(p if p.exists() else p.parent, option, path, parents)


def clean_queries(queries) -> list:
    """Command-line texts as valid UTF-8: bytes the shell passed that are not UTF-8
    (Python keeps them as lone surrogates) become U+FFFD, with one warning line."""
    out = []
    for i, q in enumerate(queries, 1):
        fixed = q.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        try:
            fixed.encode("utf-8")
        except UnicodeEncodeError:  # a surrogate that did not come from the shell
            fixed = fixed.encode("utf-8", "replace").decode("utf-8")
        if fixed != q:
            click.echo(f"warning: query {i} is not valid UTF-8; its undecodable bytes "
                       "were replaced by U+FFFD", err=True)
        out.append(fixed)
    return out


def check_encoder(ctx, param, value):
    """``--encoder`` checked when the command line is read: a folder without
    ``config.json`` or weights, a file, or a name that is neither a folder nor a Hugging
    Face model id is one usage line naming it (a few file checks, no model loaded)."""
    if value is None:
        return None
    from ..encode.encoder import EncoderLoadError, check_model_source

    try:
        check_model_source(value)
    except EncoderLoadError as e:
        raise click.BadParameter(str(e).removeprefix("encoder "), param=param) from None
    return value


def text_source_callback(*words: str):
    """A ``--summaries`` / ``--keywords`` callback: one of ``words`` (the built-in
    sources), or a file that exists (a MemGAS ``.jsonl``), checked when the command line
    is read; otherwise one usage line naming the option (a typo reached the build, after
    the data was loaded, as a traceback or an error naming neither)."""
    def check(ctx, param, value):
        if value is None or value in words:
            return value
        why = None
        if not value:
            why = "an empty value"
        elif not os.path.exists(value):
            why = "no such file"
        elif not os.path.isfile(value):
            why = "not a file"
        if why is not None:
            raise click.BadParameter(f"{value!r}: {why}; use {', '.join(map(repr, words))} "
                                     "or a MemGAS .jsonl file", param=param)
        return value
    return check


#: the built-in summary and keyword sources (``memgas_gpu.expand.resolve_source``)
TEXT_SOURCES = ("offline", "source", "locomo")


def date_callback(ctx, param, value):
    """A date option (``--date``): empty (unknown) or a date python-dateutil reads, as
    the library's ``check_date`` demands; one usage line naming the option otherwise
    (it was a traceback naming ``question_date``)."""
    if value is None or not value.strip():
        return value
    from ..retrieve.cues import parse_date

    if parse_date(value) is None:
        raise click.BadParameter(f"{value[:80]!r} is not a date python-dateutil reads (e.g. "
                                 "'2024-05-01' or '1:56 pm on 8 May, 2023'; leave it out "
                                 "when unknown)", param=param)
    return value


def _id_list(ctx, param, value):
    if value is None:
        return None
    ids = [v.strip() for v in value.split(",") if v.strip()]
    if not ids:
        raise click.BadParameter("give at least one conversation id", param=param)
    return ids


def load(data, fmt="auto", empty_sessions="error", user_only=False, conversations=None,
         exclude_conversations=None, progress=True):
    """``load_dataset`` with the dataset options; an unknown id is a usage error naming
    the option, an index folder given as DATA one naming DATA."""
    from ..data import load_dataset

    if (Path(data) / "manifest.json").exists():
        raise click.BadParameter(f"{data}: an index folder; this command reads a dataset "
                                 "(a LongMemEval or LoCoMo file, or a folder of them)",
                                 param_hint="DATA")
    try:
        return load_dataset(data, fmt, empty_sessions=empty_sessions, user_only=user_only,
                            progress=progress, conversations=conversations,
                            exclude=exclude_conversations)
    except ValueError as e:
        if type(e) is not ValueError:  # DataFormatError keeps its own exit path
            raise
        hint = ("--exclude-conversations" if conversations is None else
                "--conversations" if exclude_conversations is None else
                "--conversations/--exclude-conversations")
        raise click.BadParameter(str(e), param_hint=hint) from None


def refuse_dataset_selection(opts: dict) -> None:
    """``--conversations`` / ``--exclude-conversations`` select conversations of a
    dataset; with an index folder they were ignored without a word (every conversation
    evaluated): one usage line naming the option instead."""
    for key, option in (("conversations", "--conversations"),
                        ("exclude_conversations", "--exclude-conversations")):
        if opts.get(key):
            raise click.BadParameter("selects conversations of a dataset (DATA), not of an "
                                     "index folder", param_hint=option)


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
    @click.option("--encoder", default=None, metavar="MODEL", callback=check_encoder,
                  help="Hugging Face encoder name or local folder "
                       "[default: bundled all-MiniLM-L6-v2, offline].")
    @click.option("--pooling", type=click.Choice(("mean", "cls")), default="mean",
                  show_default=True)
    @click.option("--max-length", type=click.IntRange(1), default=None,
                  help="Tokens per text (longer texts are truncated) [default: the "
                       "model's sentence-transformers max_seq_length, else 512].")
    @click.option("--summaries", default=BuildParams.summaries, show_default=True, metavar="SRC",
                  callback=text_source_callback(*TEXT_SOURCES),
                  help="'offline', 'source' (LoCoMo's own) or a MemGAS .jsonl file.")
    @click.option("--keywords", default=BuildParams.keywords, show_default=True, metavar="SRC",
                  callback=text_source_callback(*TEXT_SOURCES),
                  help="'offline' or a MemGAS .jsonl file.")
    @click.option("--store", type=PathArg(file_okay=False), default=None,
                  help="Embedding store folder: resumable, shared across runs.")
    @click.option("--store-dtype", type=click.Choice(("float32", "float16")), default=None,
                  help="How --store keeps embeddings: float32 (a build without a store, "
                       "to float32 rounding) or float16 (half the disk; the rounding can "
                       "change a few association edges) [default: the store's own, "
                       "float32 for a new store].")
    @click.option("--m", "m", type=setting_type(BuildParams, "m"), default=BuildParams.m,
                  show_default=True, help="Candidates per node for the GMM association test.")
    @click.option("--skip-sessions", type=setting_type(BuildParams, "skip_sessions"),
                  default=BuildParams.skip_sessions, show_default=True,
                  help="The first sessions get no outgoing edges.")
    @click.option("--no-concat", is_flag=True,
                  help="Skip the embeddings of the concat baseline (summary + keywords + text).")
    @click.option("--device", default=None, help="cpu, cuda, cuda:1 … [default: auto].")
    @click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
                  metavar="[ADDRESS]",
                  help="Run on Ray: a local instance (--ray alone) or a cluster address "
                       "('auto', 'ray://host:10001').")
    @click.option("--workers", type=click.IntRange(1), default=2, show_default=True,
                  help="With --ray: encoder actors and evaluation tasks.")
    @click.option("--gpus-per-worker", type=FiniteFloat(0), default=0.0,
                  show_default=True, help="With --ray: GPUs per encoder actor (1 = one per GPU).")
    @quiet_option
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


def build_index(data, dataset=None, quiet=False, **opts):
    """Load DATA (unless ``dataset`` is already loaded from it) and build a MemoryIndex
    with the CLI's options (the keywords of :func:`dataset_options` and
    :func:`build_options`); ``quiet`` (or an enclosing ``--quiet``) silences progress
    and the stderr summary."""
    with quiet_scope(quiet):
        return _build_index(data, dataset, **opts)


def build_params(no_concat: bool = False, **settings) -> BuildParams:
    """The :class:`~memgas_gpu.retrieve.BuildParams` of the command-line options
    (``--no-concat`` and the fields the options name; the others keep their defaults)."""
    return BuildParams().replace(concat=not no_concat, **settings)


def _build_index(data, dataset, *, fmt="auto", empty_sessions="error", user_only=False,
                 conversations=None, exclude_conversations=None, encoder=None,
                 pooling="mean", max_length=None, store=None, store_dtype=None,
                 device=None, ray_address=None, workers=2, gpus_per_worker=0.0, **params):
    from ..encode import EmbeddingStore, Encoder
    from ..retrieve import MemoryIndex

    p = build_params(**params)
    ds = dataset if dataset is not None else load(data, fmt, empty_sessions, user_only,
                                                  conversations, exclude_conversations)
    if ray_address:
        if store_dtype is not None:
            raise click.UsageError("--store-dtype does not apply with --ray (the Ray "
                                   "encoders keep the store's own dtype, float32 for a "
                                   "new store)")
        ray_or_exit(ray_address)
        from ..distributed import build_index_ray

        kwargs = {"model": encoder, "pooling": pooling, "max_length": max_length}
        if device:
            kwargs["device"] = device
        info(f"indexing {len(ds)} conversations on Ray ({workers} encoder actors)")
        return build_index_ray(ds, kwargs, num_workers=workers, num_gpus=gpus_per_worker,
                               store_dir=store, params=p, device=device, progress=True)
    enc = Encoder(encoder, pooling=pooling, max_length=max_length, device=device)
    st = EmbeddingStore(store, enc.fingerprint, dtype=store_dtype) if store else None
    info(f"indexing {len(ds)} conversations, {len(ds.distinct_sessions())} distinct "
         f"sessions, {len(ds.questions)} questions with {enc.describe()['model']} "
         f"on {enc.device}" + (f" (store {store}, {st.dtype})" if st is not None else ""))
    return MemoryIndex.build(ds, enc, p, store=st, device=device, progress=True)


def ks_callback(ctx, param, value):
    """``--k`` read when the command line is: :func:`parse_ks` (errors name it)."""
    return parse_ks(value)


def settings_callback(ctx, param, value):
    """``--set`` read when the command line is: :func:`parse_settings`."""
    return parse_settings(value) if value else {}


def segmentation_callback(ctx, param, value):
    """``--segmentation`` (GAM) checked when the command line is read."""
    from ..gam.params import parse_segmentation  # no tensor code

    try:
        parse_segmentation(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def parse_ks(value: str) -> tuple:
    """``"1,3,5"`` → ``(1, 3, 5)`` (sorted, distinct, positive)."""
    try:
        ks = tuple(sorted({int(x) for x in value.split(",") if x.strip()}))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}")
    if not ks or ks[0] < 1:
        raise click.BadParameter("cut-offs must be positive integers")
    return ks


def parse_settings(specs) -> dict:
    """``("time_beta=0", "fusion=ppr")`` → read-path settings (``ReadParams`` fields,
    numbers typed by their specs; validated later by the engine)."""
    kinds = {name: spec.kind for name, spec in ReadParams.specs().items()}
    out = {}
    for spec in specs:
        key, sep, val = spec.partition("=")
        key = key.strip()
        if not sep or key not in kinds:
            raise click.BadParameter(f"expected KEY=VALUE with KEY in {', '.join(kinds)}; "
                                     f"got {spec!r}", param_hint="--set")
        kind = kinds[key]
        try:
            out[key] = (int(val) if kind == "int" else float(val) if kind == "real" else val)
        except ValueError:
            raise click.BadParameter(f"{key} takes a number, got {val!r}",
                                     param_hint="--set") from None
    return out
