"""``memgas`` command group; subcommands are registered at the bottom."""
from __future__ import annotations

import sys

import click

from .. import __version__
from ..errors import MemgasError


class _Group(click.Group):
    """Report library errors as one line and exit 2 (bad input), no traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MemgasError as e:
            click.echo("error: " + " ".join(str(e).split()), err=True)  # always one line
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="memgas")
def cli() -> None:
    """memgas: multi-granularity long-term conversational memory retrieval (MemGAS)."""


def main() -> None:  # console-script entry point
    cli(prog_name="memgas")


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
