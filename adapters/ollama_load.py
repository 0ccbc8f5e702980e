"""One Ollama load in the background, as the reference's start task runs it.

Source: ``reference/infer_lifecycle.rs.txt`` (the Ollama arm of
``start_instance``: ``LoadState``, the ``we_loaded`` flag). The requests are
:mod:`.ollama`'s; this module owns the thread, the deadline, the abort and who
the loaded model belongs to.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from .ollama import LOAD_TIMEOUT, OllamaError, load, resident
from .ollama_keep_alive import DEFAULT_KEEP_ALIVE, load_keep_alive
from .status import LoadKind, LoadState

__all__ = ["OllamaLoad"]


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
        keep_alive: how long Ollama keeps it loaded
            (see :func:`~.ollama_keep_alive.parse_keep_alive`).
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
            load(self.base_url, self.tag, self._keep, self._timeout + 1.0, trace=self._trace)
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
