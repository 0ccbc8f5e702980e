"""adapters.proc.table: the process table read from /proc/PID/stat, as psutil reads it.

The reconcile tick's process table is read from /proc directly (one file per
process) with psutil as the fallback: the same parents and start times as
psutil's on this machine's real table, a child's RSS and its parent, zombies
left out, a fake procfs root for the parsing (a name with spaces and a
parenthesis), and the fallback where /proc cannot be read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support import wait_until

from infervisor.adapters.proc import system, table
from infervisor.adapters.proc.system import REAL, _psutil_table
from infervisor.adapters.proc.table import ProcessEntry, read_proc_table

DEADLINE = 60.0  # s a real child is given to start (generous at load 10)


def test_parents_and_start_times_equal_psutils_on_this_machine() -> None:
    """Processes come and go between two reads: compared on the pids both saw;
    RSS of a process that runs changes between reads, so not compared here."""
    ours, theirs = read_proc_table().entries, _psutil_table().entries
    both = set(ours) & set(theirs)
    assert os.getpid() in both and len(both) > 1
    assert {p: ours[p][:2] for p in both} == {p: theirs[p][:2] for p in both}


def test_a_sleeping_child_with_its_parent_start_time_and_rss() -> None:
    code = "import sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        found = read_proc_table()
        process = psutil.Process(child.pid)
        assert found.entries[child.pid] == ProcessEntry(
            os.getpid(), process.create_time(), process.memory_info().rss
        )
        assert child.pid in found.descendants(os.getpid())
        assert found.is_alive(child.pid, process.create_time())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(DEADLINE)
        assert child.stdout is not None
        child.stdout.close()


def test_a_zombie_is_left_out() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(
            lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,
            DEADLINE,
            "the child exited, not yet reaped",
        )
        assert child.pid not in read_proc_table().entries
    finally:
        child.wait(DEADLINE)


def _stat(pid: int, name: str, state: str, ppid: int, start: int, rss: int) -> str:
    """A /proc/PID/stat line: pid (comm) state ppid ... starttime(22) vsize(23) rss(24) ..."""
    middle = " ".join(["0"] * 17)  # fields 5 to 21
    return f"{pid} ({name}) {state} {ppid} {middle} {start} 123456 {rss} 18446744073709551615 0\n"


def test_the_kernels_format_under_a_fake_root(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    for pid, line in {
        1: _stat(1, "init", "S", 0, 5 * ticks, 10),
        42: _stat(42, "a (weird) name) x", "R", 1, 7 * ticks, 3),
        43: _stat(43, "gone", "Z", 42, 8 * ticks, 0),
    }.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(line)
        rss = line.split(") ")[-1].split()[21]
        (tmp_path / str(pid) / "statm").write_text(f"999 {rss} 2 3 0 5 0\n")
    (tmp_path / "44").mkdir()  # exited while the table was read: no stat file
    (tmp_path / "self").mkdir()
    found = read_proc_table(str(tmp_path))
    assert found.entries == {
        1: ProcessEntry(0, 1700000005.0, 10 * page),
        42: ProcessEntry(1, 1700000007.0, 3 * page),
    }
    assert found.descendants(1) == {42: 1700000007.0}


def test_no_proc_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):  # noqa: PT011 - whichever errno the missing root gives
        read_proc_table(str(tmp_path / "absent"))


def test_the_fallback_where_proc_cannot_be_read_is_psutils(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreadable(proc: str = table.PROC) -> table.ProcessTable:
        raise PermissionError(13, "Permission denied", "/proc/stat")

    monkeypatch.setattr(system, "read_proc_table", unreadable)
    found = REAL.table()
    assert found.entries[os.getpid()][:2] == _psutil_table().entries[os.getpid()][:2]
