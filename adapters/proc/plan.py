"""Launch plans: what a managed server runs (argv, environment, working directory).

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``spawn`` builds a
``LaunchSpec`` with a cleared environment and ``OUTPUT_LIMIT`` bytes kept per
stream). The plans of each flavor are built in ``adapters/launch.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import msgspec

from .limits import ProcLimits, wrap_argv
from .output import OUTPUT_LIMIT

__all__ = ["LaunchPlan", "launch_env"]

_EMPTY: Mapping[str, str] = MappingProxyType({})


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to run: argv, the complete environment, the working directory.

    ``output_limit`` is the number of bytes kept per stream (the tail), in
    memory and in the log files in ``cwd``.
    """

    program: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    output_limit: int = OUTPUT_LIMIT
    limits: ProcLimits | None = None
    run_as: tuple[int, int] | None = None

    def argv(self) -> list[str]:
        """What is executed: the program and its arguments, through the limits
        trampoline when limits or a user are set."""
        argv = [self.program, *self.args]
        if self.limits is None and self.run_as is None:
            return argv
        return wrap_argv(argv, self.limits or ProcLimits(), self.run_as, self.env)


def launch_env(
    passthrough: Sequence[str] = ("HOME", "PATH"), extra: Mapping[str, str] = _EMPTY
) -> dict[str, str]:
    """A cleared environment: only ``passthrough`` names copied from ``os.environ``
    (when set) plus ``extra``; an extra entry wins over a passed-through one."""
    env = {name: os.environ[name] for name in passthrough if name in os.environ}
    env.update(extra)
    return env
