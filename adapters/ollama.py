"""Ollama driven through its HTTP API: residency, load, unload (synchronous httpx).

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``start_instance``,
``stop_instance``, ``unload_instance``: ``ollama::resident``, ``ollama::load``,
``ollama::unload``, ``LoadState``, the ``we_loaded`` flag) and
``reference/infer_config.rs.txt`` (``keep_alive``: ``5m``, ``30m``, ``-1``;
default ``30m``).

The protocol, from Ollama's ``docs/api.md``: a model is loaded by
``POST /api/generate`` with a model and no prompt, and unloaded the same way
with ``keep_alive`` 0 ("Load a model", "Unload a model"); ``GET /api/tags``
lists pulled models, ``GET /api/ps`` the models in memory. ``keep_alive`` is
read by ``api/types.go`` ``Duration.UnmarshalJSON``: a JSON number of seconds
(negative: forever) or a Go duration string (``time.ParseDuration``; a string
without a unit such as ``"-1"`` is refused with a 400).

Ollama lists a model in ``/api/ps`` from the moment its runner is created,
while it is still loading (``server/sched.go``), and an unload waits for a
load in progress before dropping the model.

Tags are matched ignoring a ``:latest`` suffix (``x`` is ``x:latest``). No
``httpx`` error leaves this module. The errors::

    SpecError         keep_alive is not a form Ollama reads (names the value and the forms)
    ProbeError        Ollama could not be asked (refused, reset, timed out) or answered garbage
     +-- OllamaError  Ollama answered with an error; ``status`` and ``error`` (its own words)
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec

from .errors import ProbeError, SpecError
from .status import LoadKind, LoadState

__all__ = [
    "DEFAULT_KEEP_ALIVE",
    "LOAD_TIMEOUT",
    "OllamaError",
    "OllamaLoad",
    "load",
    "load_keep_alive",
    "parse_keep_alive",
    "pulled",
    "pulled_size",
    "resident",
    "same_model",
    "unload",
    "wait_unloaded",
]

LOAD_TIMEOUT = 900.0
"""Seconds a load request may take when the caller gives none (a large model can take
minutes; the reference's value). A node gives its instance kind's startup budget
instead (``managed_ollama.load_timeout_s``)."""
DEFAULT_KEEP_ALIVE = "30m"
"""keep_alive sent with a load when none is configured (the reference's default)."""

_MAX_BODY = 4 * 1024 * 1024  # bytes read from any answer
_EXCERPT = 200  # characters of a body quoted in an error
_FOREVER_NS = 2**63 - 1  # Go's largest time.Duration
_UNIT_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": 10**9}
_UNIT_NS |= {"m": 60 * 10**9, "h": 3600 * 10**9}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_UNIT = r"(?:ns|us|µs|μs|ms|s|m|h)"
_DURATION = re.compile(rf"[-+]?(?:0|(?:{_NUMBER}{_UNIT})+)")
_PART = re.compile(rf"({_NUMBER})({_UNIT})")
_INTEGER = re.compile(r"[-+]?[0-9]+")
_MODEL_NOT_FOUND = re.compile(r"model .* not found")  # routes.go: "model 'x' not found[, ...]"
_FORMS = (
    "a whole number of seconds (3600; negative keeps the model loaded forever; 0 unloads it) "
    "or a Go duration string such as '30m', '1h30m', '10s' or '-1m' "
    "(units ns, us, ms, s, m, h; a negative duration keeps the model loaded forever)"
)

Trace = Callable[[str, dict[str, Any]], None]


class OllamaError(ProbeError):
    """Ollama answered with an error.

    Attributes:
        status: the HTTP status (404: the model is not pulled; 400: a bad
            request such as an unreadable keep_alive; 500: the load failed).
        error: Ollama's own error text.
    """

    def __init__(self, message: str, *, status: int, error: str) -> None:
        super().__init__(message)
        self.status, self.error = status, error


def same_model(a: str, b: str) -> bool:
    """Whether two Ollama tags name the same model (``x`` is ``x:latest``)."""
    return a.removesuffix(":latest") == b.removesuffix(":latest")


def parse_keep_alive(value: str | int | float) -> str | int:
    """Check a keep_alive and give the value to send to Ollama.

    Whole numbers (also as strings: ``"-1"``, ``"3600"``) become an int, sent
    as a JSON number, because Ollama refuses a string without a unit. Duration
    strings are kept as they are. Fractions of a second as a number are
    refused: older Ollama versions truncate them (``0.5`` would unload).

    Raises:
        SpecError: anything else (booleans, NaN, ``"5 m"``, ``"10x"``, a
            duration Go cannot hold), naming the value and the allowed forms.
    """
    invalid = SpecError(f"keep_alive {value!r} is not valid: use {_FORMS}")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise invalid
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise invalid
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        if _duration_ns(value) is None:
            raise invalid
        return value
    seconds = int(value)
    if seconds > _FOREVER_NS // 10**9:  # Go cannot hold it as a duration
        raise invalid
    return seconds


def _duration_ns(text: str) -> int | None:
    """Nanoseconds of a Go duration string, or None when Go would refuse it."""
    if not _DURATION.fullmatch(text):
        return None
    total = 0.0
    for number, unit in _PART.findall(text):
        total += float(number) * _UNIT_NS[unit]
    if total > _FOREVER_NS:
        return None
    return -int(total) if text.startswith("-") else int(total)


def _is_zero(keep: str | int) -> bool:
    return keep == 0 if isinstance(keep, int) else _duration_ns(keep) == 0


# --- HTTP ------------------------------------------------------------------------------


def _excerpt(body: bytes) -> str:
    text = " ".join(body[: _EXCERPT * 4].decode("utf-8", errors="replace").split())
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def _call(
    base_url: str,
    method: str,
    path: str,
    timeout: float,
    *,
    payload: Any = None,
    trace: Trace | None = None,
) -> tuple[int, bytes]:
    """One request on a fresh connection; the status and up to ``_MAX_BODY`` bytes.

    Raises:
        ProbeError: a bad URL, or Ollama could not be asked or answered too much.
    """
    where = f"{base_url}{path}"
    extensions = {"trace": trace} if trace is not None else None
    try:
        with (
            httpx.Client(base_url=base_url, timeout=timeout, trust_env=False) as http,
            http.stream(method, path, json=payload, extensions=extensions) as r,
        ):
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > _MAX_BODY:
                    raise ProbeError(f"{where}: answer larger than {_MAX_BODY} bytes")
            return r.status_code, bytes(body)
    except httpx.TimeoutException as e:
        raise ProbeError(f"{where}: no answer within {timeout} s") from e
    except httpx.ConnectError as e:
        raise ProbeError(f"{where}: cannot connect ({e})") from e
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        raise ProbeError(f"{where}: {type(e).__name__} ({e})") from e


def _decode(body: bytes) -> Any:
    """The JSON of a body; for a stream of JSON lines, the last one. None if not JSON."""
    lines = [line for line in body.splitlines() if line.strip()]
    try:
        return msgspec.json.decode(lines[-1]) if lines else None
    except msgspec.DecodeError:
        return None


def _listed(base_url: str, path: str, timeout: float) -> list[str]:
    """Names under ``models[*].name`` (or ``.model``) of an ``/api/tags`` or ``/api/ps``."""
    status, body = _call(base_url, "GET", path, timeout)
    if status != 200:
        raise ProbeError(f"{base_url}{path}: HTTP {status}: {_excerpt(body)}")
    doc = _decode(body)
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        raise ProbeError(f"{base_url}{path}: not an Ollama model list: {_excerpt(body)}")
    names: list[str] = []
    for item in models:
        name = (item.get("name") or item.get("model")) if isinstance(item, dict) else None
        if isinstance(name, str):
            names.append(name)
    return names


# --- the operations --------------------------------------------------------------------


def resident(base_url: str, tag: str, timeout: float = 2.0) -> bool:
    """Whether Ollama holds ``tag`` in memory (``GET /api/ps`` lists it; also while loading).

    ``timeout`` (seconds) bounds connecting and each read.

    Raises:
        ProbeError: Ollama could not be asked or did not answer a model list;
            "could not ask" is never reported as "not resident".
    """
    return any(same_model(name, tag) for name in _listed(base_url, "/api/ps", timeout))


def pulled(base_url: str, tag: str, timeout: float = 2.0) -> bool:
    """Whether Ollama has ``tag`` on disk (``GET /api/tags`` lists it).

    Raises:
        ProbeError: Ollama could not be asked or did not answer a model list.
    """
    return any(same_model(name, tag) for name in _listed(base_url, "/api/tags", timeout))


def pulled_size(base_url: str, tag: str, timeout: float = 2.0) -> int | None:
    """The size Ollama reports for ``tag`` on disk (``GET /api/tags`` ``size``,
    bytes; docs/api.md "List Local Models"); None when it is not listed or has
    no size. The memory a loaded model takes is larger (``/api/ps`` ``size``).

    Raises:
        ProbeError: Ollama could not be asked or did not answer a model list.
    """
    status, body = _call(base_url, "GET", "/api/tags", timeout)
    doc = _decode(body)
    models = doc.get("models") if status == 200 and isinstance(doc, dict) else None
    if not isinstance(models, list):
        raise ProbeError(f"{base_url}/api/tags: not an Ollama model list: {_excerpt(body)}")
    for item in models:
        if not isinstance(item, dict):
            continue
        name = item.get("name") or item.get("model")
        size = item.get("size")
        if isinstance(name, str) and same_model(name, tag):
            ok = isinstance(size, int) and not isinstance(size, bool) and size > 0
            return size if ok else None
    return None


def load(
    base_url: str,
    tag: str,
    keep_alive: str | int | float = DEFAULT_KEEP_ALIVE,
    timeout: float = LOAD_TIMEOUT,
) -> None:
    """Load ``tag`` into Ollama's memory for ``keep_alive``; blocks until it is loaded.

    Sends ``POST /api/generate`` with only ``model`` and ``keep_alive``.
    ``timeout`` (seconds) bounds connecting and the wait for the answer.

    Raises:
        SpecError: ``keep_alive`` is invalid, or zero (which would unload the
            model as soon as it is loaded); nothing was sent.
        OllamaError: Ollama refused (404: not pulled; 500: the load failed),
            with its own error text.
        ProbeError: Ollama could not be asked, or its answer was not a finished load.
    """
    _load(base_url, tag, load_keep_alive(keep_alive), timeout, None)


def load_keep_alive(keep_alive: str | int | float) -> str | int:
    """:func:`parse_keep_alive` for a load: also refuses a zero duration (``0``,
    ``"0"``, ``"0s"``, ``0.0``, ``"-0m"``), with which Ollama unloads the model
    as soon as it is loaded. Negative values are Ollama's "forever" (its API
    docs: "any negative number which will keep the model loaded in memory").

    Raises:
        SpecError: invalid (see :func:`parse_keep_alive`) or zero, with the reason.
    """
    keep = parse_keep_alive(keep_alive)
    if _is_zero(keep):
        raise SpecError(
            f"keep_alive {keep_alive!r} would unload the model as soon as it is loaded: "
            "give a positive duration, or a negative one to keep it loaded forever"
        )
    return keep


def _load(base_url: str, tag: str, keep: str | int, timeout: float, trace: Trace | None) -> None:
    payload = {"model": tag, "keep_alive": keep}
    status, body = _call(base_url, "POST", "/api/generate", timeout, payload=payload, trace=trace)
    _check_done(base_url, tag, "load", status, body)


def _check_done(base_url: str, tag: str, verb: str, status: int, body: bytes) -> None:
    """Raise unless ``body`` is a finished answer (``"done": true``, no ``error``).

    Ollama reports an error as ``{"error": "..."}``: with an error status, or
    as the last line of a stream that had already started (status 200).
    """
    doc = _decode(body)
    error = doc.get("error") if isinstance(doc, dict) else None
    if status == 200 and error is None and isinstance(doc, dict) and doc.get("done") is True:
        return
    if status == 200 and error is None:
        raise ProbeError(f"Ollama at {base_url} gave no finished {verb} of {tag}: {_excerpt(body)}")
    text = error if isinstance(error, str) else _excerpt(body)
    hint = (
        f"; pull it first (ollama pull {tag}): infervisor never downloads" if status == 404 else ""
    )
    message = f"Ollama at {base_url} refused to {verb} {tag}: HTTP {status}: {text}{hint}"
    raise OllamaError(message, status=status, error=text)


def unload(base_url: str, tag: str, timeout: float = 30.0) -> None:
    """Ask Ollama to drop ``tag`` from memory (``POST /api/generate``, ``keep_alive`` 0).

    Ollama has no per-client ownership of a loaded model, so call this only
    for a model this node loaded (:attr:`OllamaLoad.ours`), as the reference's
    stop does. Ollama answers at once for a model that is not loaded, and
    after the end of a load in progress; the memory is freed shortly after
    (see :func:`wait_unloaded`). A model Ollama does not know (404 "model 'x'
    not found") is not in its memory, so that counts as done. ``timeout`` in
    seconds.

    Raises:
        OllamaError: Ollama refused, with its own error text.
        ProbeError: Ollama could not be asked.
    """
    payload = {"model": tag, "keep_alive": 0}
    status, body = _call(base_url, "POST", "/api/generate", timeout, payload=payload)
    doc = _decode(body)
    if status == 404 and isinstance(doc, dict) and _MODEL_NOT_FOUND.match(str(doc.get("error"))):
        return  # Ollama does not know the model, so it is not in its memory
    _check_done(base_url, tag, "unload", status, body)


def wait_unloaded(base_url: str, tag: str, timeout: float = 30.0, poll: float = 0.1) -> bool:
    """Poll ``/api/ps`` until it no longer lists ``tag``; True once it does not.

    The memory counts as released only on an answer that does not list the
    model: a failed probe proves nothing, so polling goes on until
    ``timeout`` (seconds, monotonic) and then answers False. ``poll`` is the
    pause between probes (seconds). Never raises for a server problem.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            if not resident(base_url, tag, timeout=max(0.1, min(2.0, left))):
                return True
        except ProbeError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll, left))


# --- a load in the background ----------------------------------------------------------


class OllamaLoad:
    """One load of ``tag`` run on a thread, as the reference's start task does.

    First ``/api/ps`` is asked: a model already in memory (or being loaded)
    belongs to whoever loaded it, so it is not loaded again and is not
    :attr:`ours`. Otherwise the model is **ours from the moment we ask**:
    :attr:`ours` turns True just before the load request is sent and stays
    True if the load is aborted half way, so a stop during a load still
    unloads it. A load that fails is not ours (it holds no memory).

    States (:attr:`state`): LOADING until the thread ends, then DONE or
    FAILED with the reason. :meth:`abort` gives up on the load. A load not
    finished ``timeout`` seconds after :meth:`start` is given up the same way
    (its connection is shut down, which Ollama takes as a cancel) and FAILED
    with "not loaded within N s"; it stays :attr:`ours`, as an aborted one does.

    Args:
        base_url: Ollama's address (``http://127.0.0.1:11434``).
        tag: the model, as Ollama names it.
        keep_alive: how long Ollama keeps it loaded (see :func:`parse_keep_alive`).
        timeout: seconds the whole load may take, from :meth:`start`.
        probe_timeout: seconds the ``/api/ps`` question may take.

    Raises:
        SpecError: ``keep_alive`` is invalid or zero (raised here, not on the thread).
    """

    def __init__(
        self,
        base_url: str,
        tag: str,
        keep_alive: str | int | float = DEFAULT_KEEP_ALIVE,
        *,
        timeout: float = LOAD_TIMEOUT,
        probe_timeout: float = 2.0,
    ) -> None:
        self.base_url, self.tag = base_url, tag
        self._keep = load_keep_alive(keep_alive)
        self._timeout, self._probe_timeout = timeout, probe_timeout
        self._lock = threading.Lock()
        self._state = LoadState(LoadKind.LOADING)
        self._ours = self._aborted = self._timed_out = False
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name=f"ollama-load {tag}", daemon=True)
        self._deadline = threading.Timer(timeout, self._time_out)
        self._deadline.daemon = True

    def start(self) -> OllamaLoad:
        """Start the thread and the load's deadline; returns self. Returns at once."""
        self._thread.start()
        self._deadline.start()
        return self

    def _time_out(self) -> None:
        """The deadline passed: give up on the load, as :meth:`abort` does."""
        with self._lock:
            if self._state.kind is not LoadKind.LOADING:
                return
            self._timed_out = True
            sock = self._sock
        if sock is not None:
            _shutdown(sock)

    @property
    def state(self) -> LoadState:
        """LOADING, DONE, or FAILED with the reason."""
        with self._lock:
            return self._state

    @property
    def ours(self) -> bool:
        """This node asked Ollama to load the model, so only it may unload it."""
        with self._lock:
            return self._ours

    @property
    def aborted(self) -> bool:
        """:meth:`abort` was called."""
        with self._lock:
            return self._aborted

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the thread ends or ``timeout`` seconds pass; True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def abort(self) -> None:
        """Give up on the load; returns at once.

        If the request is in flight its connection is shut down, and Ollama
        cancels a load whose client has gone. Whatever Ollama did, a load
        already asked for stays :attr:`ours`: unload it to be sure.
        """
        with self._lock:
            self._aborted = True
            sock = self._sock
        if sock is not None:
            _shutdown(sock)

    def _run(self) -> None:
        try:
            if resident(self.base_url, self.tag, self._probe_timeout):
                self._end(LoadState(LoadKind.DONE))  # somebody else's model
                return
            with self._lock:
                aborted, late = self._aborted, self._timed_out
                self._ours = not (aborted or late)  # ours from the moment we ask
            if aborted or late:
                why = "aborted before it was asked" if aborted else self._late()
                self._end(LoadState(LoadKind.FAILED, why))
                return
            # The deadline cuts the request off; httpx's own timeout is a backstop.
            _load(self.base_url, self.tag, self._keep, self._timeout + 1.0, self._trace)
        except OllamaError as e:  # Ollama refused the load: it holds nothing of ours
            self._end(LoadState(LoadKind.FAILED, str(e)), failed=True, refused=True)
            return
        except Exception as e:  # noqa: BLE001 - the thread must always end the load
            # Cut off or unreadable answer: it may well be loaded, so it stays ours.
            self._end(LoadState(LoadKind.FAILED, f"{type(e).__name__}: {e}"), failed=True)
            return
        self._end(LoadState(LoadKind.DONE))

    def _late(self) -> str:
        return f"not loaded within {self._timeout:g} s (the load was given up)"

    def _end(self, state: LoadState, *, failed: bool = False, refused: bool = False) -> None:
        self._deadline.cancel()
        with self._lock:
            if failed and self._aborted:
                state = LoadState(LoadKind.FAILED, f"aborted ({state.error})")
            elif failed and not refused and self._timed_out:
                state = LoadState(LoadKind.FAILED, self._late())
            elif refused:
                self._ours = False  # a load Ollama refused holds no memory
            self._state, self._sock = state, None

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx trace hook: keep the load's socket so :meth:`abort` can shut it down."""
        if event != "connection.connect_tcp.complete":
            return
        sock = info["return_value"].get_extra_info("socket")
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sock, given_up = sock, self._aborted or self._timed_out
        if given_up:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    """End a connection in both directions; wakes the thread blocked reading it."""
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)
