"""``memgas`` command group; subcommands are registered at the bottom."""
from __future__ import annotations

import os
import sys

import click

from .. import __version__
from .._display import safe_text
from ..errors import MemgasError


def _one_line(e) -> str:
    if isinstance(e, str):
        text = e
    elif isinstance(e, OSError) and e.strerror:  # "[Errno 27] File too large: 'x'" → plain
        where = e.filename if e.filename is not None else ""
        text = f"{where}: {e.strerror}" if where else e.strerror
    else:
        text = str(e) or type(e).__name__
    # always one line, and nothing a terminal acts on (ids in messages come from data)
    return "error: " + safe_text(" ".join(text.split()))


def _write_errors() -> tuple:
    """What failing to write an output raises: OSError (permissions, a full disk, a
    file-size limit) and safetensors' own error for the same causes."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return (OSError,)
    return (OSError, SafetensorError)


def _usage_exit(e: click.UsageError):
    """A usage error as one line naming the command, and exit status 2."""
    where = e.ctx.command_path if e.ctx is not None else "memgas"
    click.echo(_one_line(f"{where}: {e.format_message()} (see {where} --help)"), err=True)
    sys.exit(2)


class _Group(click.Group):
    """Report library errors, and outputs that cannot be written, as one line on stderr
    with exit status 2; no traceback."""

    def parse_args(self, ctx: click.Context, args: list) -> list:
        # the group's own options (``memgas --bogus``): click printed Usage, a blank
        # line and Error; a bare ``memgas`` still prints the help
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":
                raise
            _usage_exit(e)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:  # bad arguments: one line too, naming the command
            _usage_exit(e)
        except MemgasError as e:
            click.echo(_one_line(e), err=True)
            sys.exit(2)
        except _write_errors() as e:
            click.echo(_one_line(e), err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memgas")
def cli() -> None:
    """memgas: multi-granularity long-term conversational memory retrieval (MemGAS)."""


def main() -> None:  # console-script entry point
    _reserve_stderr()
    cli(prog_name="memgas")


def _reserve_stderr() -> None:
    """Started with stderr closed (``2>&-``): point descriptor 2 at the null device, so
    that no file the command opens later gets descriptor 2 (and with it stray writes
    meant for stderr); Python itself then has no ``sys.stderr``, and progress stays off."""
    try:
        os.fstat(2)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 2:
            os.dup2(fd, 2)
            os.close(fd)


# --- subcommands (one module each) -------------------------------------------------
from .eval import eval_cmd  # noqa: E402
from .index import index  # noqa: E402
from .search import search  # noqa: E402
from .stats import stats  # noqa: E402

cli.add_command(stats)
cli.add_command(index)
cli.add_command(eval_cmd)
cli.add_command(search)
from .synth import synth  # noqa: E402

cli.add_command(synth)
from .expand import expand  # noqa: E402
from .answer import answer, qa_eval  # noqa: E402

cli.add_command(expand)
cli.add_command(answer)
cli.add_command(qa_eval)
from .bench import bench  # noqa: E402
from .sweep import sweep  # noqa: E402

cli.add_command(bench)
cli.add_command(sweep)
from .gam import gam  # noqa: E402

cli.add_command(gam)
from .serve import serve  # noqa: E402

cli.add_command(serve)
