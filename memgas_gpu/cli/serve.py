"""``memgas serve FOLDER``: an HTTP JSON service over one memory (docs/serving.md)."""
from __future__ import annotations

import sys

import click

from ._common import (FiniteFloat, PathArg, check_encoder, check_out_dir, check_runtime, info,
                      quiet_option)

_SECONDS = FiniteFloat(0, min_open=True)


class CompactAfter(click.ParamType):
    """``--compact-after``: seconds from 0 (0: at once), or ``never`` (only on ``POST
    /v1/compact``): a float, or None for never."""

    name = "seconds"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, float):
            return value
        if str(value).strip().lower() == "never":
            return None
        why = FiniteFloat(0).check(value)
        if why is not None:
            self.fail(f"{why} (give seconds from 0, or 'never')", param, ctx)
        return float(value)

    def get_metavar(self, param, ctx=None) -> str:  # click 8.1 and 8.2 signatures
        return "SECONDS|never"


def _limit(flag: str, kind, default, what: str):
    """An option of :class:`~memgas_gpu.serve.protocol.Limits` (None: its default, so
    that ``memgas --help`` does not import the protocol's models)."""
    return click.option(flag, type=kind, default=None, help=f"{what} [default: {default}]")


@click.command("serve")
@click.argument("folder", type=PathArg(file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Without keys only a local one (127.0.0.1, ::1, "
                   "localhost) unless --allow-remote-without-keys.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port (0: a free one; the URL line shows it).")
@click.option("--keys", "keys_file", type=PathArg(dir_okay=False), default=None,
              help='API keys: a JSON file {"KEY": "tenant", ...} (default: the same JSON '
                   "in MEMGAS_API_KEYS; neither: no keys, no tenants).")
@click.option("--max-batch-size", type=click.IntRange(1), default=64, show_default=True,
              help="Questions per search batch at most (1: no batching).")
@click.option("--max-wait-ms", type=FiniteFloat(0), default=5.0, show_default=True,
              help="How long a search waits for others to share its batch.")
@click.option("--encoder", default=None, callback=check_encoder,
              help="Encoder (folder or Hugging Face name) of a new memory, or checked "
                   "against an existing one's [default: the memory's own; the bundled "
                   "MiniLM for a new one].")
@click.option("--device", default=None, help="cpu or cuda (default: cpu).")
@click.option("--allow-remote-without-keys", is_flag=True,
              help="Listen on a non-local address without keys (anyone who reaches it "
                   "reads and writes every conversation).")
@click.option("--ray", "use_ray", is_flag=True,
              help="Shard the conversations over Ray Serve replicas (FOLDER/shard-i each; "
                   'pip install "memgas_gpu[serve-ray]").')
@click.option("--replicas", type=click.IntRange(1), default=2, show_default=True,
              help="With --ray: shards (one replica each). A folder keeps its count.")
@click.option("--ray-address", default=None,
              help="With --ray: a running cluster's address (default: a local one).")
@_limit("--max-questions", click.IntRange(1), 256, "Questions of one search at most (more: 422).")
@_limit("--max-sessions", click.IntRange(1), 256, "Sessions of one add at most (more: 422).")
@_limit("--max-body-bytes", click.IntRange(1), "8388608 (8 MiB)",
        "Bytes of a request body at most (more: 413).")
@_limit("--header-timeout", _SECONDS, 10.0,
        "Seconds for a request's line and headers, from the connection's start or the end "
        "of its previous response (later: 408, and the connection closed).")
@_limit("--body-timeout", _SECONDS, 30.0,
        "Seconds for a request's body once its headers are in (later: 408).")
@_limit("--keep-alive", _SECONDS, 5.0, "Seconds an idle connection is kept open.")
@_limit("--max-connections", click.IntRange(1), 1000,
        "Connections open at once (one more is answered 503 and closed).")
@click.option("--compact-after", type=CompactAfter(), default=60.0, show_default=True,
              help="Seconds after a removal before the memory is compacted, so that no "
                   "file of FOLDER keeps the removed sessions (0: at once; never: only on "
                   "POST /v1/compact).")
@click.option("--no-access-log", "no_access_log", is_flag=True,
              help="No line per request on stderr.")
@quiet_option
def serve(folder, host, port, keys_file, max_batch_size, max_wait_ms, encoder, device,
          allow_remote_without_keys, use_ray, replicas, ray_address, max_questions,
          max_sessions, max_body_bytes, header_timeout, body_timeout, keep_alive,
          max_connections, compact_after, no_access_log) -> None:
    """Serve the memory in FOLDER (created when missing) over HTTP until Ctrl-C or
    SIGTERM; print its URL on one line when ready (status lines go to stderr). Every
    write is durable before it is answered; the memory is closed (checkpointed) on the
    way out. A folder another process holds is refused at once (exit status 2)."""
    from ..serve.run import ServeOptions, is_local, probe_lock
    from ..serve.run import serve as run

    # every check before the first status line: a refusal is one line on stderr
    if not use_ray and (replicas != 2 or ray_address):
        raise click.UsageError("--replicas and --ray-address go with --ray")
    if not use_ray:
        probe_lock(folder)  # a folder another process holds: refused before any import
    try:
        import pydantic  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise click.UsageError(f"memgas serve needs uvicorn and pydantic ({e.name} is "
                               "missing): pip "
                               "install \"memgas_gpu[serve]\"") from None
    from ..serve.protocol import Limits
    from ..serve.tenants import ENV_KEYS, load_keys

    device = check_runtime(device)
    # a memory, or a new one (with --ray: a folder of shard-i memories, checked by them)
    check_out_dir(folder, "FOLDER", index=not use_ray, parents=True)
    keys, warning = load_keys(keys_file)
    if warning:
        info(f"warning: {warning}")
    if keys is None and not is_local(host):
        if not allow_remote_without_keys:
            raise click.UsageError(
                f"--host {host}: without keys (--keys FILE or {ENV_KEYS}) memgas serve "
                "listens only on this machine (127.0.0.1, ::1, localhost); give keys, or "
                "--allow-remote-without-keys to let anyone who reaches it read and write "
                "every conversation")
        info(f"warning: no keys, and listening on {host}: anyone who reaches it reads and "
             "writes every conversation")
    elif keys is None:
        info("memgas serve: no keys: local connections only, no tenants")
    else:
        info(f"memgas serve: {len(keys)} key(s), {len(keys.tenants)} tenant(s)")
    if use_ray and max_batch_size > 1:
        info(f"memgas serve: {replicas} Ray Serve replica(s), batches of up to "
             f"{max_batch_size} questions each")

    def announce(url: str) -> None:
        click.echo(url)
        sys.stdout.flush()

    given = {"max_questions": max_questions, "max_sessions": max_sessions,
             "max_body_bytes": max_body_bytes, "header_timeout_s": header_timeout,
             "body_timeout_s": body_timeout, "keep_alive_s": keep_alive,
             "max_connections": max_connections}
    limits = Limits(**{k: v for k, v in given.items() if v is not None})
    run(ServeOptions(folder, host, port, keys, max_batch_size, max_wait_ms, encoder, device,
                     use_ray, replicas, ray_address, limits=limits,
                     compact_after_s=compact_after, access_log=not no_access_log),
        out=announce, note=info)
