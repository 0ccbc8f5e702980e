"""``infervisor chain pull URL DIR``: mirror a node's chain from its tlog-tiles log.

The work is :func:`~.pull.pull` (also what a witness's ``--audit`` calls);
this module is the command: options, progress on stderr, the answer.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..clikit.command import Command
from ..clikit.failure import Failure, echo_json
from ..clikit.paths import KEY
from ..clikit.tokens import token_of
from ..clikit.urls import checked_url
from .pull import TRUST_FIRST_USE, PullError, PullReport, pull

__all__ = ["PULL_TOKEN_NAMES", "PullError", "PullReport", "pull", "pull_cmd"]

PULL_TOKEN_NAMES = ("auditor", "operator", "controller")
"""The tokens of an api-tokens.json a pull sends, in order of preference: the least
scope first (a node's generated file has operator and controller)."""


@click.command("pull", cls=Command)
@click.argument("url", metavar="URL")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--token", help="A bearer token of scope read (default: INFERVISOR_TOKEN).")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    help="A file holding the token, or the node's api-tokens.json (see --token-name).",
)
@click.option(
    "--token-name",
    help="The token of --token-file's api-tokens.json to send (any scope reads). "
    "Default: auditor, else operator, else controller, the first the file has.",
)
@click.option(
    "--key",
    type=KEY,
    help="The node's verifier key (string or file). Default: the one DIR pinned at its "
    "first pull; at the first pull without --key, the node's own key is trusted on first use.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def pull_cmd(  # noqa: PLR0917 - one parameter per option, as click passes them
    url: str,
    folder: Path,
    token: str | None,
    token_file: Path | None,
    token_name: str | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Mirror the node at URL into DIR (a chain.db every chain reader opens), verifying
    as it goes: the checkpoint's signature, that it extends the one DIR holds (a fork
    or a rollback is refused), every event's hash and link, the hash tiles and the
    signed root. Run again, it fetches only what is new; an interrupted pull resumes.
    """
    url = checked_url(url, "URL")
    if folder.exists() and not folder.is_dir():
        raise Failure(f"DIR {folder}: is a file, not a directory", "bad_path", "DIR")
    secret = token_of(token, token_file, token_name or PULL_TOKEN_NAMES)
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 2.0 or done == total:
            last[0] = now
            click.echo(f"pulled {done:,} of {total:,} events", err=True)

    try:
        report = pull(url, folder, token=secret, key=key, progress=progress)
    except PullError as e:
        raise Failure(str(e), e.code, e.field) from e
    if as_json:
        echo_json(report)
    else:
        click.echo(
            f"pulled {report.added:,} new events of node {report.node} into {folder} "
            f"(size {report.old_size:,} -> {report.new_size:,}; key: {report.trust})"
        )
    if report.trust == TRUST_FIRST_USE:
        click.echo(
            f"warning: {TRUST_FIRST_USE}; check {folder}/node.pub against the node's "
            "key by another channel",
            err=True,
        )
    sys.exit(0)
