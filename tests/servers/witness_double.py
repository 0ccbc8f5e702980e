"""A small C2SP tlog-witness for tests, written from the spec (c2sp.org/tlog-witness).

``POST <prefix>/add-checkpoint`` only, as "add-checkpoint" says:

- the body is ``old N``, up to 63 base64 proof lines, an empty line, a signed
  checkpoint; anything else is 400;
- the checkpoint's origin must be a configured log (404 otherwise) and carry
  a valid signature of that log's key (403 otherwise; unknown keys ignored);
- old above the checkpoint's size is 400; old not the size of the latest
  checkpoint cosigned for the origin is 409 with a ``text/x.tlog.size`` body;
- old 0 with a proof, a proof that does not verify (RFC 6962), or old equal
  to the size with another root, is 422;
- otherwise the state is updated (atomically with the check: one lock) and
  the answer is the witness's cosignature/v1 line (timestamp never zero).

State per origin: (size, root) of the latest cosigned checkpoint, in memory;
it outlives :meth:`WitnessDouble.stop` / :meth:`start` (a witness that was
down comes back with what it had). ``hold()`` makes each answer wait, after
the state is updated, until ``release()`` (a node killed mid-submission).
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from infervisor.chain.cosignature import Cosigner
from infervisor.chain.errors import NoteError, ProofError
from infervisor.chain.merkle import verify_consistency
from infervisor.chain.note import Verifier, open_note

__all__ = ["WitnessDouble"]


class WitnessDouble:
    """A witness on 127.0.0.1 (:attr:`url`), trusting the given logs' keys by origin."""

    def __init__(self, name: str, logs: list[Verifier], port: int = 0) -> None:
        self.cosigner = Cosigner.generate(name)
        self.logs = {v.name: v for v in logs}
        self.state: dict[str, tuple[int, bytes]] = {}
        self.requests: list[tuple[str, int]] = []  # (origin, status) of each answer
        self.lock = threading.Lock()
        self.holding = threading.Event()  # an answer is waiting on the gate
        self._gate = threading.Event()
        self._gate.set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def vkey(self) -> str:
        return self.cosigner.key.key_string()

    def size_of(self, origin: str) -> int:
        with self.lock:
            return self.state.get(origin, (0, b""))[0]

    def start(self) -> None:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, kind, body = double.add_checkpoint(self.path, self.rfile.read(length))
                if status == 200 and not double._gate.is_set():
                    double.holding.set()
                    double._gate.wait()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop answering (connections refused); the state is kept."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def hold(self) -> None:
        self.holding.clear()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    # ------------------------------------------------------------ the protocol
    def add_checkpoint(self, path: str, raw: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) of one add-checkpoint request."""
        if path.rstrip("/").split("/")[-1] != "add-checkpoint":
            return 404, "text/plain", b"not found\n"
        try:
            old, proof, note = _parse(raw)
        except ValueError as e:
            return 400, "text/plain", f"{e}\n".encode()
        origin = note.split("\n", 1)[0]
        log_key = self.logs.get(origin)
        if log_key is None:
            return 404, "text/plain", b"unknown origin\n"
        try:
            text = open_note(note, [log_key])
        except NoteError as e:
            return 403, "text/plain", f"{e}\n".encode()
        lines = text.split("\n")
        size, root = int(lines[1]), base64.b64decode(lines[2])
        status, kind, body = self._check_and_cosign(origin, old, proof, (size, root), text)
        with self.lock:
            self.requests.append((origin, status))
        return status, kind, body

    def _check_and_cosign(
        self, origin: str, old: int, proof: list[bytes], tree: tuple[int, bytes], text: str
    ) -> tuple[int, str, bytes]:
        size, root = tree
        if old > size:
            return 400, "text/plain", b"old size above the checkpoint's\n"
        with self.lock:  # the check and the update are one step (the spec's race)
            have, have_root = self.state.get(origin, (0, b""))
            if old != have:
                return 409, "text/x.tlog.size", f"{have}\n".encode()
            try:
                if old == 0 and proof:
                    raise ProofError("a proof from size 0")
                if old == size and root != have_root:
                    raise ProofError("another root for the same size")
                if 0 < old < size:
                    verify_consistency(old, size, have_root, root, proof)
            except ProofError as e:
                return 422, "text/plain", f"{e}\n".encode()
            self.state[origin] = (size, root)
        line = self.cosigner.cosign(text, max(1, int(time.time()))).line
        return 200, "text/plain; charset=utf-8", (line + "\n").encode()


def _parse(raw: bytes) -> tuple[int, list[bytes], str]:
    text = raw.decode("utf-8")
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise ValueError("no empty line before the checkpoint")
    lines = head.split("\n")
    if not lines[0].startswith("old "):
        raise ValueError("the first line must be 'old N'")
    digits = lines[0][4:]
    if not digits.isdigit() or (digits != "0" and digits.startswith("0")):
        raise ValueError("old size is not a decimal")
    if len(lines) - 1 > 63:
        raise ValueError("more than 63 proof lines")
    try:
        proof = [base64.b64decode(line, validate=True) for line in lines[1:]]
    except binascii.Error as e:
        raise ValueError(f"a proof line is not base64: {e}") from e
    return int(digits), proof, note
