"""What an instance is: its flavor, mode, model and endpoint.

Source of the behaviour: ``reference/infer_runtime.rs.txt`` (``plan``,
``instance_id``) and the spec validation it calls: role and node id are plain
tokens, a managed server binds loopback only, the port is in 1..65535.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from typing import Any

import blake3
import msgspec

from .errors import SpecError
from .spec_env import check_env

__all__ = [
    "MIN_MEMORY_MAX_BYTES",
    "Flavor",
    "InstanceSpec",
    "Mode",
    "instance_id",
    "is_loopback",
    "valid_token",
]

#: llama.cpp's own ceiling on the context length (tokens).
MAX_SPEC_BYTES = 16 * 1024
"""Most bytes of a spec encoded as JSON (escapes included). Every event must fit
one C2SP tlog-tiles entry (a uint16 length: docs/chain-format.md, "Tiles") with
its payload in base64, and a placement's event carries the whole spec."""

MAX_CTX = 1 << 24
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class Flavor(enum.StrEnum):
    """Server software. The value is the adapter id's middle part (``infer.<value>``)."""

    LLAMACPP = "llamacpp"
    MLX_LM = "mlx-lm"
    OLLAMA = "ollama"

    @property
    def default_port(self) -> int:
        """The flavor's conventional port (llama.cpp and mlx-lm 8080, Ollama 11434)."""
        return 11434 if self is Flavor.OLLAMA else 8080

    def adapter_id(self, mode: Mode) -> str:
        """``infer.<flavor>`` when managed, ``infer.<flavor>.adopted`` when adopted."""
        base = f"infer.{self.value}"
        return base if mode is Mode.MANAGED else f"{base}.adopted"


class Mode(enum.StrEnum):
    """Adopted: observe a server somebody else started. Managed: launch and control it."""

    ADOPTED = "adopted"
    MANAGED = "managed"


def valid_token(value: str, max_len: int = 64) -> bool:
    """A plain token: ASCII letters, digits, ``.``, ``_``, ``-``; not starting with punctuation.

    The whole string must match (``fullmatch``): ``$`` would also match before a
    trailing newline, and ``"chat\\n"`` is not a token.
    """
    return 0 < len(value) <= max_len and _TOKEN.fullmatch(value) is not None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any 127.0.0.0/8 or ::1 literal."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class InstanceSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One model server instance, as a node controller or a config file places it.

    Attributes:
        role: plain token naming the instance's job (``chat``, ``embed``); first
            part of the instance id.
        flavor: the server software.
        port: TCP port of the server's HTTP API (1..65535).
        mode: adopted or managed.
        model: registry name of the model (managed: required; adopted: optional,
            used to check the server lists it).
        host: address the server listens on and is probed at; loopback only when
            managed.
        ctx_size: context length in tokens passed to llama.cpp (``-c``).
        draft_model: registry name of a draft model for speculative decoding.
        env: extra environment entries for the launched server.
        kind: workload kind, which defines health interval and judgement.
        continuous: False for a one-shot run that finishes on exit 0.
        restart: overrides of the restart policy's fields for this instance
            (``max_restarts``, ``base_s``, ``cap_s``, ``stable_after_s``,
            ``window_s``, ``jitter``); checked when the instance is placed.
        memory_max_bytes: the server's memory limit in bytes, written to its
            cgroup, at least :data:`MIN_MEMORY_MAX_BYTES` (64 MiB) (managed
            llama.cpp and mlx-lm only; refused at placement
            where the node has no memory cgroup); None: no limit. The kernel's
            OOM killer ends a server that exceeds it, recorded as such.
        on_demand: placed ``resting`` and started by the first request or
            verb for it (issue 21; managed only).
        idle_ttl_s: released to ``resting`` after this many seconds without a
            request (> 0, at most 7 days; managed only); None: never.
        priority: an eviction takes instances of lower or equal priority only
            (-1000..1000).
        pinned: never evicted (managed only).
        embeddings: serve embeddings only (llama-server's ``--embeddings``:
            ``/v1/embeddings`` answers, completions may not); managed
            llama.cpp only.
        pooling: how token embeddings are pooled (llama-server's ``--pooling``,
            one of :data:`POOLINGS`); None: the model's own (a model with none,
            a causal LM, must be given one for ``/v1/embeddings``); managed
            llama.cpp only.
        threads: CPU threads the server generates with (llama-server's
            ``--threads``/``-t``, 1 to :data:`MAX_THREADS`; its batches use as
            many, as llama-server's ``--threads-batch`` defaults to it); None:
            the launcher's default (2); managed llama.cpp only. A node that also
            runs the front, probes or other servers keeps cores for them this way.
    """

    role: str
    flavor: Flavor
    port: int
    mode: Mode = Mode.MANAGED
    model: str | None = None
    host: str = "127.0.0.1"
    ctx_size: int = 512
    draft_model: str | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    kind: str = "inference"
    continuous: bool = True
    restart: dict[str, Any] | None = None
    memory_max_bytes: int | None = None
    on_demand: bool = False
    idle_ttl_s: float | None = None
    priority: int = 0
    pinned: bool = False
    embeddings: bool = False
    pooling: str | None = None
    threads: int | None = None

    def validate(self) -> None:
        """Check every field an operator can get wrong.

        Raises:
            SpecError: naming the field, the value and what is allowed.
        """
        if not valid_token(self.role):
            raise SpecError(
                f"role {self.role!r} must be a plain token (letters, digits, '.', '_', '-', "
                "at most 64 characters)",
                field="role",
            )
        if not 1 <= self.port <= 65535:
            raise SpecError(f"port {self.port} is out of range: allowed 1-65535", field="port")
        if self.mode is Mode.MANAGED:
            if not is_loopback(self.host):
                raise SpecError(
                    f"host {self.host!r}: a managed server binds loopback only "
                    "(127.0.0.1, ::1 or localhost)",
                    field="host",
                )
            if not self.model:
                raise SpecError(
                    "model: managed mode needs a model name from the registry", field="model"
                )
        if self.memory_max_bytes is not None:
            _check_memory_max(self)
        if not 8 <= self.ctx_size <= MAX_CTX:
            raise SpecError(
                f"ctx_size {self.ctx_size}: allowed 8 to {MAX_CTX} tokens", field="ctx_size"
            )
        check_env(self.env)
        _check_residency(self)
        _check_embeddings(self)
        _check_threads(self)
        _check_encoded_size(self)

    @property
    def base_url(self) -> str:
        """``http://host:port`` (IPv6 literals bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def bind_host(self) -> str:
        """The address to check for a listener (``localhost`` resolved to 127.0.0.1)."""
        return "127.0.0.1" if self.host == "localhost" else self.host


#: The smallest memory limit a spec may give (bytes, 64 MiB). The tiny test model's
#: llama-server (0.5 MB of weights, 512 tokens of context) holds 41 MB resident when
#: ready and after completions (VmHWM, stop 33b); below that the kernel's OOM killer
#: ends the server as it loads, and the restart policy starts it into the same end.
MIN_MEMORY_MAX_BYTES = 64 << 20


def _check_memory_max(spec: InstanceSpec) -> None:
    limit = spec.memory_max_bytes
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise SpecError(
            f"memory_max_bytes {limit!r}: allowed a whole number of bytes from "
            f"{MIN_MEMORY_MAX_BYTES} (64 MiB), or none",
            field="memory_max_bytes",
        )
    if limit < MIN_MEMORY_MAX_BYTES:
        raise SpecError(
            f"memory_max_bytes {limit}: allowed at least {MIN_MEMORY_MAX_BYTES} (64 MiB), or "
            "none: even a tiny llama-server holds about 41 MB once loaded, so a smaller "
            "limit has the kernel's OOM killer end the server as it starts, restart after "
            "restart",
            field="memory_max_bytes",
        )
    if spec.mode is not Mode.MANAGED or spec.flavor is Flavor.OLLAMA:
        raise SpecError(
            f"memory_max_bytes {limit}: allowed only for a managed llama.cpp or mlx-lm "
            "server (an adopted or Ollama server is not a process of this node's)",
            field="memory_max_bytes",
        )


#: The longest idle_ttl_s allowed, seconds (7 days).
MAX_IDLE_TTL_S = 7 * 24 * 3600.0
#: The shortest idle_ttl_s allowed, seconds: idleness is judged on the reconcile
#: tick, and a shorter one would release a server between two requests of one client.
MIN_IDLE_TTL_S = 1.0
#: The priority range of an instance.
PRIORITY_RANGE = (-1000, 1000)


def _check_residency(spec: InstanceSpec) -> None:
    """The residency fields (issue 21): ranges, and none of the node's memory
    policy for an adopted server (it is not the node's memory)."""
    ttl = spec.idle_ttl_s
    if ttl is not None and (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not MIN_IDLE_TTL_S <= ttl <= MAX_IDLE_TTL_S
    ):
        raise SpecError(
            f"idle_ttl_s {ttl!r}: allowed seconds from {MIN_IDLE_TTL_S:g} to "
            f"{MAX_IDLE_TTL_S:g} (7 days), or none",
            field="idle_ttl_s",
        )
    low, high = PRIORITY_RANGE
    prio = spec.priority
    if isinstance(prio, bool) or not isinstance(prio, int) or not low <= prio <= high:
        raise SpecError(
            f"priority {prio!r}: allowed a whole number from {low} to {high}", field="priority"
        )
    if spec.mode is Mode.ADOPTED:
        for name, value in (
            ("on_demand", spec.on_demand),
            ("idle_ttl_s", ttl),
            ("pinned", spec.pinned),
        ):
            if value not in (None, False):
                raise SpecError(
                    f'{name} {value!r}: not allowed for mode "adopted" (an adopted server is '
                    "not the node's memory: the node neither starts nor releases it)",
                    field=name,
                )


#: llama-server's ``--pooling`` choices.
POOLINGS = ("none", "mean", "cls", "last", "rank")


def _check_embeddings(spec: InstanceSpec) -> None:
    """``embeddings`` and ``pooling``: a managed llama.cpp server's flags only."""
    llamacpp = spec.flavor is Flavor.LLAMACPP and spec.mode is Mode.MANAGED
    if spec.embeddings is not False and (spec.embeddings is not True or not llamacpp):
        raise SpecError(
            f"embeddings {spec.embeddings!r}: allowed true or false, and true only for a "
            "managed llama.cpp server (its --embeddings flag)",
            field="embeddings",
        )
    if spec.pooling is None:
        return
    if spec.pooling not in POOLINGS or not llamacpp:
        raise SpecError(
            f"pooling {spec.pooling!r}: allowed {', '.join(POOLINGS)}, for a managed "
            "llama.cpp server only (its --pooling flag)",
            field="pooling",
        )


#: The most CPU threads a spec may give a server (the launcher's own bound, its ``-t``).
MAX_THREADS = 1024


def _check_threads(spec: InstanceSpec) -> None:
    """``threads``: a whole number from 1 to :data:`MAX_THREADS`, for a managed
    llama.cpp server only (its ``--threads``)."""
    n = spec.threads
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise SpecError(
            f"threads {n!r}: allowed a whole number from 1 to {MAX_THREADS}, or none (the "
            "launcher's default, 2), for a managed llama.cpp server only (its --threads)",
            field="threads",
        )
    if spec.flavor is not Flavor.LLAMACPP or spec.mode is not Mode.MANAGED:
        raise SpecError(
            f"threads {n}: only a managed llama.cpp server takes threads (its --threads); "
            f"this one is {spec.flavor.value}, {spec.mode.value}: leave threads out",
            field="threads",
        )


def instance_id(spec: InstanceSpec, node_id: str) -> str:
    """``<role>-<first 8 hex of BLAKE3 over role, flavor, model, base URL, mode>-<node>``.

    Source: ``reference/infer_runtime.rs.txt`` ``instance_id``: the fields are
    hashed one after another with no separator, exactly as the reference does.

    Raises:
        SpecError: the node id is not a plain token.
    """
    if not valid_token(node_id):
        raise SpecError(f"node id {node_id!r} must be a plain token")
    h = blake3.blake3()
    for part in (spec.role, spec.flavor.value, spec.model or "", spec.base_url, spec.mode.value):
        h.update(part.encode())
    return f"{spec.role}-{h.hexdigest()[:8]}-{node_id}"


def _check_encoded_size(spec: InstanceSpec) -> None:
    size = len(msgspec.json.encode(spec))
    if size <= MAX_SPEC_BYTES:
        return
    env = len(msgspec.json.encode(spec.env))
    field = "env" if env * 2 > size else "spec"
    raise SpecError(
        f"{field}: the spec is {size} bytes as JSON ({env} of them the env, escapes "
        f"included); allowed at most {MAX_SPEC_BYTES} (16 KiB), so that its event fits "
        "one tiles entry of the chain",
        field="env" if field == "env" else None,  # None: the spec as a whole
    )


#: What each integer or number field of a spec allows, in the words of its own
#: check above: an API body's value beyond 64 bits is refused before the spec is
#: built (tools/api/strict.py), and quotes the field's range, not the 64-bit one
#: (a newcomer's trial, stop 34: ``spec.port`` 2^64 read "allowed -2^63 to 2^63-1").
NUMBER_RANGES = {
    "port": "1-65535",
    "ctx_size": f"8 to {MAX_CTX} tokens",
    "priority": f"a whole number from {PRIORITY_RANGE[0]} to {PRIORITY_RANGE[1]}",
    "memory_max_bytes": (
        f"a whole number of bytes from {MIN_MEMORY_MAX_BYTES} (64 MiB) to 2^63-1, or none"
    ),
    "idle_ttl_s": f"seconds from {MIN_IDLE_TTL_S:g} to {MAX_IDLE_TTL_S:g} (7 days), or none",
    "threads": f"a whole number from 1 to {MAX_THREADS}, or none",
}
