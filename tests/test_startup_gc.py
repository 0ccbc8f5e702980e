"""A command's process starts without the cyclic garbage collector and turns it back
on, once what it runs on is loaded, with that frozen (tools/clikit/startup.py).

What it saves is CPU (bench/cli_startup.py measures it); these tests check only
that the collector is on again where the command does its work, and that a
command run inside another program's process (the tests' CliRunner) leaves that
program's collector alone.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from support import cli_here, probe_record

#: Runs ``infervisor ARGS`` as the console script does, then prints the collector's
#: state as the command left it (stderr's last line).
_PROBE = """
import gc, json, sys
from infervisor.tools.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "enabled": gc.isenabled(),
                  "frozen": gc.get_freeze_count()}), file=sys.stderr)
"""


def _collector_after(*args: str, cwd: Path) -> dict[str, object]:
    record: dict[str, object] = probe_record(_PROBE, *args, cwd=cwd)
    return record


def test_a_command_runs_with_the_collector_on_and_its_start_up_frozen(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    record = _collector_after("status", "data", cwd=tmp_path)
    # no node and no chain there: asked of the socket, then refused as a usage error
    assert record["code"] == 2
    assert record["enabled"] is True
    assert isinstance(record["frozen"], int) and record["frozen"] > 0  # its start-up, frozen


def test_the_collector_stays_off_only_during_the_start_up(tmp_path: Path) -> None:
    """The console entry point turns it off; nothing but ``startup.done`` turns it on."""
    code = (
        "import gc; from infervisor.tools.clikit import startup\n"
        "startup.begin(); off = not gc.isenabled()\n"
        "startup.done(); frozen = gc.get_freeze_count()\n"
        "startup.done(); again = gc.get_freeze_count()\n"
        "print(off, gc.isenabled(), frozen > 0, again == frozen)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "True", "True", "True"]


def test_a_command_in_this_process_leaves_its_collector_alone(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    frozen = gc.get_freeze_count()
    assert cli_here("status", tmp_path / "data").returncode == 2  # no node, no chain
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
