"""Ollama's HTTP API, as a client: residency, pulled models, load, unload (synchronous httpx).

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``start_instance``,
``stop_instance``, ``unload_instance``: ``ollama::resident``, ``ollama::load``,
``ollama::unload``). The load in the background (``LoadState``, the
``we_loaded`` flag) is :mod:`.ollama_load`; the forms of ``keep_alive`` are
:mod:`.ollama_keep_alive`.

The protocol, from Ollama's ``docs/api.md``: a model is loaded by
``POST /api/generate`` with a model and no prompt, and unloaded the same way
with ``keep_alive`` 0 ("Load a model", "Unload a model"); ``GET /api/tags``
lists pulled models, ``GET /api/ps`` the models in memory.

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

import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec

from .errors import ProbeError, excerpt
from .ollama_keep_alive import DEFAULT_KEEP_ALIVE, load_keep_alive
from .ollama_wire import byte_count, same_model
from .tls import client_tls

__all__ = [
    "LOAD_TIMEOUT",
    "OllamaError",
    "load",
    "pulled",
    "pulled_size",
    "resident",
    "unload",
    "wait_unloaded",
]

LOAD_TIMEOUT = 900.0
"""Seconds a load request may take when the caller gives none (a large model can take
minutes; the reference's value). A node gives its instance kind's startup budget
instead (``managed_ollama.load_timeout_s``)."""

_MAX_BODY = 4 * 1024 * 1024  # bytes read from any answer
_MODEL_NOT_FOUND = re.compile(r"model .* not found")  # routes.go: "model 'x' not found[, ...]"

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


# --- HTTP ------------------------------------------------------------------------------


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
            httpx.Client(
                base_url=base_url,
                timeout=timeout,
                trust_env=False,
                verify=client_tls(trust_env=False),
            ) as http,
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


def _listed(base_url: str, path: str, timeout: float) -> list[tuple[str, dict[str, Any]]]:
    """The entries of an ``/api/tags`` or ``/api/ps`` answer, each with its name
    (``models[*].name``, else ``.model``); entries without one are left out.

    Raises:
        ProbeError: Ollama could not be asked, or did not answer a model list.
    """
    status, body = _call(base_url, "GET", path, timeout)
    if status != 200:
        raise ProbeError(f"{base_url}{path}: HTTP {status}: {excerpt(body)}")
    doc = _decode(body)
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        raise ProbeError(f"{base_url}{path}: not an Ollama model list: {excerpt(body)}")
    entries: list[tuple[str, dict[str, Any]]] = []
    for item in models:
        name = (item.get("name") or item.get("model")) if isinstance(item, dict) else None
        if isinstance(name, str):
            entries.append((name, item))
    return entries


# --- the operations --------------------------------------------------------------------


def resident(base_url: str, tag: str, timeout: float = 2.0) -> bool:
    """Whether Ollama holds ``tag`` in memory (``GET /api/ps`` lists it; also while loading).

    ``timeout`` (seconds) bounds connecting and each read.

    Raises:
        ProbeError: Ollama could not be asked or did not answer a model list;
            "could not ask" is never reported as "not resident".
    """
    return any(same_model(name, tag) for name, _ in _listed(base_url, "/api/ps", timeout))


def pulled(base_url: str, tag: str, timeout: float = 2.0) -> bool:
    """Whether Ollama has ``tag`` on disk (``GET /api/tags`` lists it).

    Raises:
        ProbeError: Ollama could not be asked or did not answer a model list.
    """
    return any(same_model(name, tag) for name, _ in _listed(base_url, "/api/tags", timeout))


def pulled_size(base_url: str, tag: str, timeout: float = 2.0) -> int | None:
    """The size Ollama reports for ``tag`` on disk (``GET /api/tags`` ``size``,
    bytes; docs/api.md "List Local Models"); None when it is not listed or has
    no size. The memory a loaded model takes is larger (``/api/ps`` ``size``).

    Raises:
        ProbeError: Ollama could not be asked or did not answer a model list.
    """
    for name, item in _listed(base_url, "/api/tags", timeout):
        if same_model(name, tag):
            return byte_count(item.get("size")) or None
    return None


def load(
    base_url: str,
    tag: str,
    keep_alive: str | int | float = DEFAULT_KEEP_ALIVE,
    timeout: float = LOAD_TIMEOUT,
    *,
    trace: Trace | None = None,
) -> None:
    """Load ``tag`` into Ollama's memory for ``keep_alive``; blocks until it is loaded.

    Sends ``POST /api/generate`` with only ``model`` and ``keep_alive``.
    ``timeout`` (seconds) bounds connecting and the wait for the answer.
    ``trace``: httpx's trace hook for the request (:class:`~.ollama_load.OllamaLoad`
    keeps the socket with it, to cut the request off).

    Raises:
        SpecError: ``keep_alive`` is invalid, or zero (which would unload the
            model as soon as it is loaded); nothing was sent.
        OllamaError: Ollama refused (404: not pulled; 500: the load failed),
            with its own error text.
        ProbeError: Ollama could not be asked, or its answer was not a finished load.
    """
    payload = {"model": tag, "keep_alive": load_keep_alive(keep_alive)}
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
        raise ProbeError(f"Ollama at {base_url} gave no finished {verb} of {tag}: {excerpt(body)}")
    text = error if isinstance(error, str) else excerpt(body)
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
