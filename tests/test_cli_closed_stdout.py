"""A command whose standard output is closed early (``status | head -1``) ends
quietly with exit 141 (tools/clikit/closed_stdout.py; docs/cli.md, "Exit status").

Stop 35's trial: such a command exited 1, the status of a refusal, or printed
Python's "Exception ignored ... BrokenPipeError" and exited 120. The console
script runs as a process of its own, its standard output a pipe whose reader is
closed before it starts: its first write, or the flush at its end, meets EPIPE
every time (no race with a reader that reads a line first).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_cli import build_chain
from test_run_resume import EXIT_DEADLINE_S, INFERVISOR

from infervisor.tools.api.exit_codes import Exit


def run_into_closed_pipe(*args: object) -> subprocess.CompletedProcess[str]:
    """``infervisor ARGS`` with its standard output a pipe nobody reads any more."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [str(INFERVISOR), *map(str, args)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=EXIT_DEADLINE_S,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chain(tmp_path_factory.mktemp("closed") / "chain.db")


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],  # the root group's own output
        ["status", "--help"],  # a command's parsing
        ["status", "{db}"],  # a callback's table (replayed from the chain)
        ["events", "{db}", "--jsonl"],
        ["status", "{db}", "nope", "--json"],  # a refusal: said on stderr, its JSON lost
    ],
)
def test_a_command_whose_reader_went_away_exits_141_and_says_nothing(
    chain: Path, args: list[str]
) -> None:
    ended = run_into_closed_pipe(*(a.format(db=chain) for a in args))
    assert ended.returncode == Exit.CLOSED_STDOUT == 141, ended.stderr
    assert "Traceback" not in ended.stderr
    assert "Exception ignored" not in ended.stderr and "BrokenPipeError" not in ended.stderr
    if "nope" in args:  # the refusal is still said where someone reads it
        assert "error: no instance 'nope'" in ended.stderr, ended.stderr
    else:  # its notes (unanchored, replayed from the chain), no error
        assert "error" not in ended.stderr.lower(), ended.stderr
