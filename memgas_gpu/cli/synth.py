"""``memgas synth --out FILE``: write a synthetic LongMemEval-format dataset."""
from __future__ import annotations

from typing import Optional

import click

from ._common import FiniteFloat, PathArg, check_out_file, quiet_option
from ..synth import (
    DEFAULT_ABSTENTION_RATE,
    DEFAULT_DISTRACTOR_RATE,
    LIMITS,
    SCALES,
    SynthParamError,
    validate_params,
    write_synthetic,
)

_OPTION = {"questions": "--questions", "sessions": "--sessions", "turns": "--turns",
           "words": "--words", "pool": "--pool", "abstention_rate": "--abstention-rate",
           "distractor_rate": "--distractor-rate", "distinct_sessions": "--distinct-sessions",
           "size": "--questions/--sessions/--turns/--words",
           "pool_size": "--pool/--sessions/--turns/--words"}


def _distinct(value: Optional[str]):
    if value is None or value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"an integer or 'all', got {value!r}",
                                 param_hint="'--distinct-sessions'") from None


def _preset_help() -> str:
    return "; ".join(f"{k}: " + ", ".join(f"{n}={v}" for n, v in p.items())
                     for k, p in SCALES.items())


@click.command("synth")
@click.option("--out", "out", required=True, type=PathArg(dir_okay=False, writable=True),
              help="Output JSON file (written atomically).")
@click.option("--scale", type=click.Choice(list(SCALES)), default="s", show_default=True,
              help=f"Shape preset ({_preset_help()}); explicit options override it.")
@click.option("--questions", type=int, default=None, help=f"Questions (= haystacks; at most {LIMITS['questions']:,}).")
@click.option("--sessions", type=int, default=None, help=f"Sessions per haystack (3 to {LIMITS['sessions']:,}).")
@click.option("--turns", type=int, default=None, help=f"Messages per session (2 to {LIMITS['turns']:,}).")
@click.option("--words", type=int, default=None, help=f"About how many words per message (at most {LIMITS['words']:,}).")
@click.option("--pool", type=int, default=None,
              help=f"Shared filler-session pool size (at most {LIMITS['pool']:,}) "
                   "[default: 2 x sessions].")
@click.option("--distinct-sessions", "distinct_sessions", default=None, metavar="N|all",
              help="Distinct filler sessions in the file: N (the pool size, as --pool) or "
                   "'all' (every session its own, nothing for deduplication to save; "
                   "streamed). Default: the pool, 2 x sessions.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option("--abstention-rate", type=FiniteFloat(0, 1), default=DEFAULT_ABSTENTION_RATE,
              show_default=True, help="Fraction of _abs (abstention) questions.")
@click.option("--distractor-rate", type=FiniteFloat(0, 1), default=DEFAULT_DISTRACTOR_RATE,
              show_default=True, help="Fraction of pool sessions with an unrelated fact.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Progress on stderr (--no-progress: as --quiet).")
@quiet_option
def synth(out: str, scale: str, questions: Optional[int], sessions: Optional[int],
          turns: Optional[int], words: Optional[int], pool: Optional[int],
          distinct_sessions: Optional[str], seed: int, abstention_rate: float,
          distractor_rate: float, progress: bool) -> None:
    """Write a synthetic LongMemEval-format file (realistic chat, planted evidence).

    Deterministic for a seed. `--scale m` is the LongMemEval-M shape (500 questions x
    500 sessions, ~1M tokens per haystack, ~2.5 GB); its 250,000 session slots reuse
    about 1,800 distinct sessions unless --distinct-sessions says otherwise.

    Sizes are bounded, and checked before anything is written: at most 10,000,000,000
    words in the file (questions x sessions x turns x words, about 60 GB) and
    200,000,000 in the shared pool (pool x turns x words, held in memory).
    """
    check_out_file(out)
    distinct = _distinct(distinct_sessions)
    preset = SCALES[scale]
    shape = {
        "questions": preset["questions"] if questions is None else questions,
        "sessions": preset["sessions"] if sessions is None else sessions,
        "turns": preset["turns"] if turns is None else turns,
        "words": preset["words"] if words is None else words,
    }
    try:
        validate_params(**shape, pool=pool, abstention_rate=abstention_rate,
                        distractor_rate=distractor_rate, distinct_sessions=distinct)
    except SynthParamError as e:
        raise click.BadParameter(e.message, param_hint=f"'{_OPTION[e.param]}'") from None
    summary = write_synthetic(out, **shape, pool=pool, seed=seed,
                              abstention_rate=abstention_rate,
                              distractor_rate=distractor_rate,
                              progress=None if progress else False,
                              distinct_sessions=distinct)
    click.echo(summary.line())
