"""The launch path works when the node's descriptors are numbered above 1024 (issue 17).

``select()`` cannot watch a descriptor at or above FD_SETSIZE (1024): it raised
"filedescriptor out of range" once API connections had pushed the node past
1,024 descriptors, and the instance stayed ``starting`` with its server
untracked. Here the test process holds 1,100 descriptors and then spawns a
managed process through adapters.proc.spawn, so the shim's report pipe is
numbered above 1024. ``infervisor run`` also raises its own soft limit.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Exits, script_plan

from infervisor.adapters.proc.handles import ManagedProcess
from infervisor.tools.node.boot import raise_descriptor_limit
from infervisor.tools.node.config import ApiConfig

#: Descriptors held open before the spawn: more than select()'s FD_SETSIZE.
HELD = 1100
DEADLINE_S = 60.0  # a bound on a hang, never a measurement: generous at load 10


@pytest.fixture
def many_descriptors() -> Iterator[list[int]]:
    """HELD descriptors open in this process (the soft limit raised as far as allowed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = HELD + 200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}; this test needs {wanted}")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(HELD)]
    try:
        yield held
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_managed_process_starts_and_exits_with_descriptors_above_1024(
    many_descriptors: list[int], tmp_path: Path
) -> None:
    assert max(many_descriptors) >= 1024
    exits = Exits(DEADLINE_S)
    proc = ManagedProcess.spawn(script_plan("exit_nonzero.py", "0", cwd=tmp_path), exits)
    try:
        assert proc.identity.pid > 0  # the shim's report was read: the server is tracked
        info = exits.wait()
        assert (info.exit_code, info.pid) == (0, proc.identity.pid)
    finally:
        proc.kill_tree()


def test_infervisor_run_raises_its_soft_descriptor_limit_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}: nothing to raise to")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # the usual default soft limit
    try:
        assert raise_descriptor_limit(ApiConfig()) == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
