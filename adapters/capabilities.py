"""Capability probe: does this node have what an adapter needs?

A managed llama.cpp or mlx-lm adapter passes when its serve program answers
its version command with exit 0 (the first line of its output is recorded as
the version); a managed Ollama adapter passes when Ollama answers
``/api/version`` at its conventional port; adopted adapters need nothing of
their own. ``provides()`` lists what passed. Source: ``ManagedConfig.version_probe``
in ``reference/infer_config.rs.txt`` and ``probe_capabilities`` in
``reference/infer_runtime.rs.txt``.
"""

from __future__ import annotations

import subprocess

import msgspec

from .errors import AdmissionRefused
from .launch import resolve_program
from .probe import HealthKind, ServerClient
from .server import AdapterSettings
from .spec import Flavor

__all__ = ["Capability", "probe_capabilities", "version_of"]

VERSION_TIMEOUT_S = 30.0


class Capability(msgspec.Struct, frozen=True):
    """One adapter this node can run, with the version its probe reported."""

    adapter_id: str
    ok: bool
    version: str = ""
    detail: str = ""


def version_of(program: str, args: tuple[str, ...] = ("--version",)) -> str:
    """Run ``program args``; the first line of its output when it exits 0.

    Raises:
        AdmissionRefused: not found, not executable, timed out, or a non-zero exit.
    """
    path = resolve_program(program)
    try:
        done = subprocess.run(
            [path, *args], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AdmissionRefused(f"{program} {' '.join(args)}: {e}") from e
    lines = (done.stdout or done.stderr).strip().splitlines()
    if done.returncode != 0:
        raise AdmissionRefused(f"{program} {' '.join(args)} exited {done.returncode}")
    return lines[0] if lines else ""


def probe_capabilities(settings: AdapterSettings, enabled: tuple[str, ...]) -> list[Capability]:
    """Probe every enabled adapter; the list says which passed and why not."""
    return [_probe(adapter_id, settings) for adapter_id in enabled]


def _probe(adapter_id: str, settings: AdapterSettings) -> Capability:
    if adapter_id.endswith(".adopted"):
        return Capability(adapter_id, ok=True, detail="observes servers others run")
    flavor = Flavor(adapter_id.removeprefix("infer."))
    if flavor is Flavor.OLLAMA:
        return _probe_ollama(adapter_id, settings)
    program = settings.llamacpp_program if flavor is Flavor.LLAMACPP else settings.mlx_program
    # mlx_lm.server has no --version; answering --help shows it runs.
    args = ("--version",) if flavor is Flavor.LLAMACPP else ("--help",)
    try:
        version = version_of(program, args)
        if version.startswith("usage:"):
            version = f"{program} (answers --help)"
        return Capability(adapter_id, ok=True, version=version)
    except AdmissionRefused as e:
        return Capability(adapter_id, ok=False, detail=str(e))


def _probe_ollama(adapter_id: str, settings: AdapterSettings) -> Capability:
    url = f"http://127.0.0.1:{Flavor.OLLAMA.default_port}"
    with ServerClient(url, settings.probe_timeout_s) as client:
        report = client.probe(Flavor.OLLAMA)
    if report.health.kind is HealthKind.UNREACHABLE:
        return Capability(
            adapter_id, ok=False, detail=f"no ollama at {url}: {report.health.reason}"
        )
    return Capability(adapter_id, ok=True, version=report.version or "")
