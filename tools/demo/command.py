"""``infervisor demo``: the command, its working folder and its printed report.

The steps themselves (:mod:`.steps`: a node, a real server, a SIGKILL and the
restart) load only when the command runs, so ``infervisor --help`` stays
quick.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..audit.timeline import print_timeline
from ..clikit.command import Command
from ..clikit.failure import echo_json, fail

__all__ = ["demo"]


@click.command(cls=Command)
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Work in this new or empty folder instead of a new temporary one. Either way "
    "the folder is kept afterwards, so its chain can be audited.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report instead of text.")
@click.option(
    "--flavor",
    type=click.Choice(["llamacpp", "mlx-lm"]),
    default="llamacpp",
    show_default=True,
    help="Server software: llama.cpp (the llamacpp extra) or mlx-lm (the mlx extra).",
)
def demo(workdir: Path | None, as_json: bool, flavor: str) -> None:
    """Run the main job offline on a real llama.cpp server and a tiny generated model.

    Generates the model, starts a managed server, sends a completion,
    SIGKILLs the server and watches the supervised restart, stops it, verifies
    the chain and prints the instance's timeline. Exit 0 only if every step held.
    """
    from infervisor.adapters.spec import Flavor  # noqa: PLC0415

    from .steps import data_dir_default, run_demo  # noqa: PLC0415 - keeps --help fast

    if workdir is not None and workdir.exists() and any(workdir.iterdir()):
        fail(f"--dir {workdir} is not empty: the demo needs a new or empty folder", "bad_path")
    workdir = workdir or data_dir_default()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--dir {workdir}: cannot create it: {e.strerror or e}", "bad_path", "--dir")
    quiet = as_json
    say = (lambda _m: None) if quiet else click.echo
    progress = (lambda _m: None) if quiet or not sys.stderr.isatty() else _progress
    if not quiet:
        click.echo(f"infervisor demo in {workdir}")
    report = run_demo(workdir, say, progress, Flavor(flavor))
    if as_json:
        echo_json(report)
    else:
        click.echo("\ntimeline of " + report.instance_id)
        print_timeline(report.timeline)
        total = sum(s.seconds for s in report.steps)
        click.echo(
            f"\n{'demo ok' if report.ok else 'demo FAILED'} ({total:.1f} s); chain: "
            f"{workdir / 'chain.db'}"
        )
    sys.exit(0 if report.ok else 1)


def _progress(line: str) -> None:
    click.echo("\r" + line.ljust(60), nl=not line, err=True)
