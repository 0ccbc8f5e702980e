"""How many requests a server is serving now, from the server's own counters.

Idle is known from the requests the node routes; a client that talks to a
server directly is seen only by the server. This module reads what each
flavor says about its own work, for the node to feed its residency decisions
as an observation (issue 21: "Idle is known ... from the server's own
counters where it has them").

What each flavor can tell (sources: llama.cpp ``tools/server/README.md``,
Ollama ``docs/api.md`` "List Running Models" and ``server/sched.go``)::

    flavor     read                                   in_flight          also known
    llamacpp   GET /slots (on unless --no-slots)      slots with         slot count
                                                      is_processing
               else GET /metrics (needs --metrics)    requests_          requests deferred
                                                      processing         (waiting for a slot)
               neither enabled (both answer 501)      None
    ollama     GET /api/ps                            None: Ollama has   loaded (listed, expiry
                                                      no in-flight count in the future), expires_at
    mlx-lm     nothing (mlx_lm.server has no          None               -
               counters endpoint)

``/slots`` counts slots, not requests: a request waiting for a free slot is in
neither ``is_processing`` nor the slot count (``/metrics``'
``requests_deferred`` counts it). Ollama sets a model's ``expires_at`` to
now + keep_alive when its last request *ends* (``sched.go``: the runner's
reference count drops to 0), so an ``expires_at`` that moved later between two
reads (:func:`renewed`) proves a request ended in between; a request still
running does not move it, so Ollama alone cannot tell busy from idle.

The errors (a subclass of the adapters' :class:`~.errors.ProbeError`)::

    ProbeError
     +-- ActivityError   the server could not be asked, or its answer is not the
                         counters the flavor documents (``source``, ``status``)

Nothing here keeps a prompt or a completion: ``/slots`` shows them, only the
``is_processing`` flags are read.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from .errors import ProbeError, excerpt
from .http_get import GetFailed, KeepAliveGet
from .ollama_wire import running_models, same_model
from .spec import Flavor

__all__ = [
    "Activity",
    "ActivityError",
    "ActivityReader",
    "ActivitySource",
    "from_metrics",
    "from_ps",
    "from_slots",
    "renewed",
]

MAX_BODY = 4 * 1024 * 1024
"""Bytes read of an answer: ``/slots`` repeats every slot's sampling parameters."""

_NOT_ENABLED = 501  # llama-server: "This server does not support ... endpoint"
_PROCESSING = "llamacpp:requests_processing"
_DEFERRED = "llamacpp:requests_deferred"


class ActivitySource(enum.StrEnum):
    """Where an :class:`Activity` was read."""

    SLOTS = "llamacpp./slots"
    METRICS = "llamacpp./metrics"
    OLLAMA_PS = "ollama./api/ps"
    NONE = "none"  # the server exposes no counters (mlx-lm; llama-server with both off)


class Activity(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of a server's own counters.

    Attributes:
        in_flight: requests the server is serving now; None when the server
            cannot say (Ollama, mlx-lm, llama-server with ``/slots`` and
            ``/metrics`` both off). Never a guess.
        source: where it was read.
        seen: what the read saw, in words (for a log line or an event reason).
        slots: llama-server's slot count (``/slots``); None elsewhere.
        deferred: requests waiting for a slot (``/metrics``
            ``llamacpp:requests_deferred``); None elsewhere.
        loaded: Ollama: the model is listed by ``/api/ps`` with an expiry in
            the future (or none: kept forever); None elsewhere.
        expires_at_ns: Ollama: the listed ``expires_at``, ns since the epoch,
            UTC; None when not listed, absent, or "forever".
    """

    in_flight: int | None
    source: ActivitySource
    seen: str
    slots: int | None = None
    deferred: int | None = None
    loaded: bool | None = None
    expires_at_ns: int | None = None

    @property
    def idle(self) -> bool | None:
        """True: serving nothing now; False: serving; None: the server cannot say."""
        return None if self.in_flight is None else self.in_flight == 0


class ActivityError(ProbeError):
    """The server could not be asked, or answered something other than its counters.

    Attributes:
        source: which read failed.
        status: the HTTP status of the answer; None when there was none.
    """

    def __init__(self, message: str, *, source: ActivitySource, status: int | None) -> None:
        super().__init__(message)
        self.source, self.status = source, status


# --- pure readings of one answer ------------------------------------------------------


def from_slots(body: bytes) -> Activity:
    """The reading of a ``GET /slots`` answer (status 200): a JSON list of slots,
    each with a boolean ``is_processing``.

    Raises:
        ActivityError: not JSON, not a list, or a slot without a boolean
            ``is_processing``.
    """
    try:
        doc: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        doc = None
    slots = doc if isinstance(doc, list) and doc else [None]  # a server has >= 1 slot
    flags = [s.get("is_processing") if isinstance(s, dict) else None for s in slots]
    if not all(isinstance(f, bool) for f in flags):
        raise _unreadable(ActivitySource.SLOTS, 200, "a list of slots with is_processing", body)
    busy = sum(1 for f in flags if f is True)
    return Activity(
        in_flight=busy,
        source=ActivitySource.SLOTS,
        seen=f"{busy} of {len(flags)} slots processing",
        slots=len(flags),
    )


def from_metrics(body: bytes) -> Activity:
    """The reading of a ``GET /metrics`` answer (status 200, Prometheus text
    format, read with prometheus_client's parser): the gauges
    ``llamacpp:requests_processing`` and ``llamacpp:requests_deferred``.

    Raises:
        ActivityError: not Prometheus text, or ``requests_processing`` missing
            or not a whole number >= 0.
    """
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for sample in family.samples:
                values.setdefault(sample.name, sample.value)
    except (ValueError, TypeError, IndexError):
        values = {}
    processing, deferred = _count(values.get(_PROCESSING)), _count(values.get(_DEFERRED))
    if processing is None:
        raise _unreadable(ActivitySource.METRICS, 200, f"the gauge {_PROCESSING}", body)
    waiting = "" if deferred is None else f", {deferred} deferred"
    return Activity(
        in_flight=processing,
        source=ActivitySource.METRICS,
        seen=f"{processing} requests processing{waiting}",
        deferred=deferred,
    )


def from_ps(body: bytes, tag: str, now_ns: int) -> Activity:
    """The reading of a ``GET /api/ps`` answer (status 200) for the model ``tag``
    at wall time ``now_ns`` (ns since the epoch, UTC). ``in_flight`` is None:
    Ollama gives no count of requests in flight.

    Raises:
        ActivityError: not an Ollama model list.
    """
    try:
        models = running_models(msgspec.json.decode(body))
    except msgspec.DecodeError:
        models = None
    if models is None:
        raise _unreadable(ActivitySource.OLLAMA_PS, 200, "an Ollama model list", body)
    entry = next((m for m in models if same_model(m.name, tag)), None)
    expires = None if entry is None else entry.expires_at_ns
    loaded = entry is not None and (expires is None or expires > now_ns)
    if entry is None:
        seen = f"{tag} not listed"
    elif expires is None:
        seen = f"{tag} listed with no expiry (kept loaded)"
    else:
        seen = f"{tag} listed, expires in {(expires - now_ns) / 1e9:.1f} s"
    return Activity(
        in_flight=None,
        source=ActivitySource.OLLAMA_PS,
        seen=seen + "; Ollama gives no in-flight count",
        loaded=loaded,
        expires_at_ns=expires,
    )


def renewed(before: Activity, after: Activity) -> bool:
    """Whether Ollama renewed the model's keep_alive between two readings of
    ``/api/ps``: its ``expires_at`` moved later, which Ollama does when a
    request for it ends (so one ended in between). False when either reading
    has no expiry."""
    a, b = before.expires_at_ns, after.expires_at_ns
    return a is not None and b is not None and b > a


def _count(value: float | None) -> int | None:
    """A gauge that counts things: a whole number >= 0, else None."""
    if value is None or not math.isfinite(value) or value < 0 or not float(value).is_integer():
        return None
    return int(value)


def _unreadable(source: ActivitySource, status: int | None, wanted: str, body: bytes) -> Exception:
    return ActivityError(
        f"{source.value}: expected {wanted}, got: {excerpt(body)}", source=source, status=status
    )


# --- reading a server ----------------------------------------------------------------


class ActivityReader:
    """Reads one server's counters over one kept-alive connection.

    llama.cpp: ``/slots`` first; once it answers 501 (started with
    ``--no-slots``) ``/metrics`` is read from then on; both 501: ``in_flight``
    None, ``source`` NONE, asked again on the next read (a restarted server
    may have them). Ollama: ``/api/ps`` for ``tag`` (required). mlx-lm: no
    I/O, ``in_flight`` None. Not thread-safe: one reader per caller.

    Args:
        flavor: the server's flavor.
        base_url: ``http://host:port``.
        tag: the model's Ollama tag (Ollama only).
        timeout: seconds for connecting and for each read.

    Raises:
        ValueError: ``base_url`` is not ``http(s)://host[:port]``, or Ollama without a tag.
    """

    def __init__(
        self, flavor: Flavor, base_url: str, *, tag: str | None = None, timeout: float = 2.0
    ) -> None:
        if flavor is Flavor.OLLAMA and not tag:
            raise ValueError("an Ollama activity reader needs the model's tag")
        self.flavor, self.tag = flavor, tag
        self._get = KeepAliveGet(base_url, timeout, MAX_BODY)
        self._slots_off = False

    def read(self, now_ns: int) -> Activity:
        """One reading. ``now_ns``: wall time, ns since the epoch (Ollama's expiry
        is a wall time). Blocks for at most about two timeouts.

        Raises:
            ActivityError: the server could not be asked (``status`` None), or
                answered an error status or something unreadable.
        """
        if self.flavor is Flavor.MLX_LM:
            return Activity(
                in_flight=None, source=ActivitySource.NONE, seen="mlx-lm exposes no counters"
            )
        if self.flavor is Flavor.OLLAMA:
            assert self.tag is not None  # checked in __init__
            return from_ps(self._ask("/api/ps", ActivitySource.OLLAMA_PS), self.tag, now_ns)
        if not self._slots_off:
            try:
                return from_slots(self._ask("/slots", ActivitySource.SLOTS))
            except ActivityError as e:
                if e.status != _NOT_ENABLED:
                    raise
                self._slots_off = True
        try:
            return from_metrics(self._ask("/metrics", ActivitySource.METRICS))
        except ActivityError as e:
            if e.status != _NOT_ENABLED:
                raise
        self._slots_off = False
        return Activity(
            in_flight=None,
            source=ActivitySource.NONE,
            seen="llama-server has /slots and /metrics off (--no-slots, no --metrics)",
        )

    def _ask(self, path: str, source: ActivitySource) -> bytes:
        try:
            reply = self._get.get(path)
        except GetFailed as e:
            raise ActivityError(f"{source.value}: {e}", source=source, status=None) from e
        if reply.status != 200 or reply.truncated:
            what = "more than 4 MiB" if reply.truncated else f"HTTP {reply.status}"
            raise ActivityError(
                f"{source.value}: {what}: {excerpt(reply.body)}", source=source, status=reply.status
            )
        return reply.body

    def close(self) -> None:
        """Close the connection."""
        self._get.close()
