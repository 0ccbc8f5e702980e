"""Resource limits and the user a managed server runs as, applied by exec-ing
through a tiny trampoline (``python -I -S -c``) so no ``preexec_fn`` runs in
this multi-threaded process; the server keeps the trampoline's pid.

Source: ``reference/infer_lifecycle.rs.txt`` (``unlimited``: model servers map
tens of GiB of weights and many files, so large finite limits: address space
2^46 bytes, file size 2^44 bytes, 4096 open files; ``run_as`` when root).
"""

from __future__ import annotations

import json
import os
import sys

import msgspec

__all__ = ["ProcLimits", "wrap_argv"]


class ProcLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Limits for a server process. Bytes for sizes; ``nofile`` is a count."""

    mem_bytes: int = 1 << 46
    fsize_bytes: int = 1 << 44
    nofile: int = 4096


_TRAMPOLINE = """
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
for name, value in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["run_as"]:
    uid, gid = cfg["run_as"]
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
try:
    os.execvpe(sys.argv[2], sys.argv[2:], cfg["env"])
except OSError as e:
    sys.stderr.write(f"cannot start {sys.argv[2]}: {e.strerror}\\n")
    sys.exit(127)
"""


def wrap_argv(
    argv: list[str],
    limits: ProcLimits,
    run_as: tuple[int, int] | None,
    env: dict[str, str],
) -> list[str]:
    """``argv`` run under ``limits`` (and as ``run_as`` when this node is root),
    exec'd with exactly ``env`` (the trampoline's own Python may add to its
    environment, such as PEP 538's locale coercion; the server must not inherit it).

    A limit above the current hard limit is lowered to it (an unprivileged node
    cannot raise its own), so the wrapped program always starts.
    """
    import resource  # noqa: PLC0415 - Unix only, like the rest of the launch path

    wanted = {
        "RLIMIT_AS": limits.mem_bytes,
        "RLIMIT_FSIZE": limits.fsize_bytes,
        "RLIMIT_NOFILE": limits.nofile,
    }
    capped = {}
    for name, value in wanted.items():
        hard = resource.getrlimit(getattr(resource, name))[1]
        capped[name] = value if hard == resource.RLIM_INFINITY else min(value, hard)
    cfg = {
        "limits": capped,
        "run_as": list(run_as) if run_as and os.geteuid() == 0 else None,
        "env": env,
    }
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, json.dumps(cfg), *argv]
