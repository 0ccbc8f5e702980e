"""The node's GPUs, as the vendors' own command-line tools report them.

Two tools are asked when they are on ``PATH``, each with a short timeout:

- NVIDIA: ``nvidia-smi --query-gpu=index,name,memory.total,memory.free
  --format=csv,noheader,nounits``: one line per GPU, fields separated by
  ``", "``, memory in MiB (nvidia-smi(1), "--query-gpu"; ``[N/A]`` where a
  value is not available);
- AMD: ``rocm-smi --showproductname --showmeminfo vram --json``: one object
  per card keyed ``card<N>``, with ``"Card series"`` (the product name) and
  ``"VRAM Total Memory (B)"`` / ``"VRAM Total Used Memory (B)"`` in bytes, as
  strings (ROCm SMI's JSON output).

A tool that is missing is not an error (the node has no such GPU); one that
fails, times out or prints what cannot be parsed is reported in
:attr:`GpuReport.errors`, one line each, never raised. :class:`GpuCache`
keeps the last report for a few seconds, so a frequently asked
``GET /v1/node`` does not run the tools each time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import msgspec

__all__ = [
    "NVIDIA_ARGS",
    "ROCM_ARGS",
    "Gpu",
    "GpuCache",
    "GpuReport",
    "parse_nvidia_csv",
    "parse_rocm_json",
    "query_gpus",
]

#: nvidia-smi's arguments: index, name, total and free memory (MiB), CSV without header or units.
NVIDIA_ARGS = (
    "--query-gpu=index,name,memory.total,memory.free",
    "--format=csv,noheader,nounits",
)
#: rocm-smi's arguments: product name and VRAM use, as JSON.
ROCM_ARGS = ("--showproductname", "--showmeminfo", "vram", "--json")
#: How long one tool may take, seconds.
QUERY_TIMEOUT_S = 5.0
#: How long :class:`GpuCache` keeps a report, seconds.
CACHE_TTL_S = 10.0

_MIB = 1024 * 1024


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU: its vendor (``nvidia`` or ``amd``), the tool's index, its
    product name, and its memory, total and free, in bytes."""

    vendor: str
    index: int
    name: str
    memory_total_bytes: int
    memory_free_bytes: int


class GpuReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the tools found (``gpus``) and what went wrong asking them (``errors``)."""

    gpus: list[Gpu] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)


def parse_nvidia_csv(text: str) -> GpuReport:
    """The GPUs of nvidia-smi's ``csv,noheader,nounits`` answer to :data:`NVIDIA_ARGS`.

    A name may itself hold commas: the index is the first field, the two
    memory figures (MiB) the last two, the name what lies between. A line
    without four fields, or with a value that is not a number (``[N/A]``,
    ``[Not Supported]``), is one error naming the line; the others still count.
    """
    gpus: list[Gpu] = []
    errors: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        try:
            if len(fields) < 4:
                raise ValueError("expected index, name, total, free")  # noqa: TRY301 - one handler per line
            index, total, free = int(fields[0]), int(fields[-2]), int(fields[-1])
        except ValueError as e:
            why = str(e) if len(fields) < 4 else "index and memory must be numbers"
            errors.append(f"nvidia-smi line {line!r}: {why}")
            continue
        gpus.append(
            Gpu(vendor="nvidia", index=index, name=", ".join(fields[1:-2]),
                memory_total_bytes=total * _MIB, memory_free_bytes=free * _MIB)
        )  # fmt: skip
    return GpuReport(gpus=gpus, errors=errors)


def parse_rocm_json(text: str) -> GpuReport:
    """The GPUs of rocm-smi's JSON answer to :data:`ROCM_ARGS`.

    Keys other than ``card<N>`` (``system``) are skipped; the name is
    ``"Card series"``, else ``"Card model"``; free memory is total less used.
    Output that is not a JSON object is one error; so is each card without
    its VRAM figures in bytes (the others still count).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        data = f"not JSON: {e}"
    if not isinstance(data, dict):
        return GpuReport(errors=[f"rocm-smi: {data if isinstance(data, str) else 'not an object'}"])
    gpus: list[Gpu] = []
    errors: list[str] = []
    for key, card in data.items():
        if not key.startswith("card") or not key[4:].isdigit() or not isinstance(card, dict):
            continue
        try:
            total = int(card["VRAM Total Memory (B)"])
            used = int(card["VRAM Total Used Memory (B)"])
        except (KeyError, TypeError, ValueError):
            errors.append(f"rocm-smi {key}: no VRAM Total (Used) Memory (B) in bytes")
            continue
        name = str(card.get("Card series") or card.get("Card model") or key)
        gpus.append(
            Gpu(vendor="amd", index=int(key[4:]), name=name,
                memory_total_bytes=total, memory_free_bytes=max(0, total - used))
        )  # fmt: skip
    return GpuReport(gpus=sorted(gpus, key=lambda g: g.index), errors=errors)


#: Each tool: (program, its arguments, the parser of its output).
_TOOLS: tuple[tuple[str, tuple[str, ...], Callable[[str], GpuReport]], ...] = (
    ("nvidia-smi", NVIDIA_ARGS, parse_nvidia_csv),
    ("rocm-smi", ROCM_ARGS, parse_rocm_json),
)


def query_gpus(timeout_s: float = QUERY_TIMEOUT_S) -> GpuReport:
    """Ask each tool found on ``PATH``; blocks up to ``timeout_s`` per tool.

    Never raises: a tool that fails is one line of :attr:`GpuReport.errors`.
    """
    import shutil  # noqa: PLC0415 - the node's side only: a client's start-up never loads it

    gpus: list[Gpu] = []
    errors: list[str] = []
    for program, args, parse in _TOOLS:
        path = shutil.which(program)
        if path is None:
            continue
        try:
            found = parse(_run(program, path, args, timeout_s))
        except ValueError as e:
            errors.append(str(e))
            continue
        gpus.extend(found.gpus)
        errors.extend(found.errors)
    return GpuReport(gpus=gpus, errors=errors)


def _run(program: str, path: str, args: tuple[str, ...], timeout_s: float) -> str:
    """The tool's standard output.

    Raises:
        ValueError: it could not run, timed out, or exited non-zero (with its
            first line of error output).
    """
    import subprocess  # noqa: PLC0415 - the node's side only: a client's start-up never loads it

    try:
        done = subprocess.run(
            [path, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"{program}: no answer in {timeout_s:g} s") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{program}: {e}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ValueError(f"{program} exited {done.returncode}" + (f": {said[0]}" if said else ""))
    return done.stdout


class GpuCache:
    """The last :class:`GpuReport`, asked again once it is ``ttl_s`` seconds old.

    Only the first :meth:`get` waits for the tools; later ones answer the last
    report at once and, when it has aged past ``ttl_s``, start one refresh in a
    background thread (a tool that hangs delays no caller, only its own
    refresh). Thread-safe. ``query`` and ``clock`` (monotonic seconds) are
    injectable for tests; ``background`` False refreshes in the caller instead.
    """

    def __init__(
        self,
        query: Callable[[], GpuReport] = query_gpus,
        ttl_s: float = CACHE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        background: bool = True,
    ) -> None:
        self._query = query
        self._ttl_s = ttl_s
        self._clock = clock
        self._background = background
        self._lock = threading.Lock()
        self._first = threading.Lock()
        self._report: GpuReport | None = None
        self._at = 0.0
        self._refreshing = False

    def get(self) -> GpuReport:
        """The last report (the first call waits for one); a stale one starts a refresh."""
        with self._first:  # only until there is a report: then never held for long
            if self._report is None:
                self._store(self._query())
        with self._lock:
            report = self._report
            stale = self._clock() - self._at >= self._ttl_s and not self._refreshing
            if stale:
                self._refreshing = True
        assert report is not None
        if stale:
            if self._background:
                threading.Thread(target=self._refresh, name="gpu-query", daemon=True).start()
            else:
                self._refresh()
                return self._report or report
        return report

    def _refresh(self) -> None:
        try:
            self._store(self._query())
        finally:
            with self._lock:
                self._refreshing = False

    def _store(self, report: GpuReport) -> None:
        with self._lock:
            self._report, self._at = report, self._clock()
