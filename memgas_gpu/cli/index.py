"""``memgas index DATA --out DIR``."""
from __future__ import annotations

import click

from ._common import (PathArg, build_index, build_options, check_out_dir, check_runtime,
                      dataset_options)


@click.command("index")
@click.argument("data", type=PathArg(exists=True))
@click.option("--out", required=True, type=PathArg(file_okay=False),
              help="Index folder to write (replaced atomically; checked before any work).")
@dataset_options
@build_options
def index(data, out, **opts) -> None:
    """Expand, encode and link every conversation of DATA; save the index to OUT."""
    opts["device"] = check_runtime(opts["device"])
    check_out_dir(out, index=True)
    if opts["store"]:
        check_out_dir(opts["store"], "--store", parents=True)
    idx = build_index(data, **opts)
    idx.save(out)
    t = idx.config.get("timings", {})
    enc = idx.config["encoding"]["sessions_and_texts"]
    indptr, _ = idx.view().graph()
    click.echo(f"wrote {out}: {idx.n_conversations} conversations, {idx.n_rows} sessions, "
               f"{len(idx.questions)} questions, {int(indptr[-1]) // 2} edges; "
               f"{enc['distinct']} distinct texts of {enc['texts']}; "
               + ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in t.items()))
