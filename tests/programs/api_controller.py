"""A node controller in its own process, speaking only the control API.

usage: api_controller.py --controller ID NAME=DATA_DIR [NAME=DATA_DIR ...]

Each NAME is a node reached through ``DATA_DIR/api.sock``
(:class:`infervisor.tools.api.client.ApiClient`). Commands come one JSON
object per line on stdin; each is answered by one JSON line on stdout,
``{"ok": true, "answer": ...}`` or ``{"ok": false, "error": {"type", "code",
"status", "field", "message"}}``, in the order asked. ``op`` is one of:

- ``place``: ``node``, ``spec`` (an InstanceSpec object), ``generation``,
  ``start`` (default false): placed as this controller; answers the PlaceAnswer.
- ``start`` / ``stop`` / ``status``: ``node``, ``instance``.
- ``list`` / ``node``: ``node``: every instance's view; the node's info.
- ``heartbeat``: one heartbeat to ``node`` (every node when absent).
- ``beat``: ``every_s``: heartbeat every node every ``every_s`` seconds from
  now on (on a thread of its own), until ``silence``.
- ``silence``: stop heartbeating; answered once the beating thread has ended,
  so no heartbeat is sent after the answer: ``{"beats": N, "failures": [...]}``.
- ``quit``: answered, then the program exits 0 (so does end of input).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec

from infervisor.adapters.spec import InstanceSpec
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import ApiError


class Beater:
    """Heartbeats every node on a thread of its own, each with its own client."""

    def __init__(self, controller: str, dirs: dict[str, Path], every_s: float) -> None:
        self.controller = controller
        self.every_s = every_s
        self.clients = {name: ApiClient(data_dir=d, timeout_s=10.0) for name, d in dirs.items()}
        self.beats = 0
        self.failures: list[str] = []
        self._quiet = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._quiet.is_set():
            for name, client in self.clients.items():
                try:
                    client.heartbeat(self.controller)
                    self.beats += 1
                except ApiError as e:
                    self.failures.append(f"{name}: {type(e).__name__}: {e}")
            self._quiet.wait(self.every_s)

    def silence(self) -> dict[str, Any]:
        """Stop; once this returns no heartbeat is in flight or will be sent."""
        self._quiet.set()
        self._thread.join()
        for client in self.clients.values():
            client.close()
        return {"beats": self.beats, "failures": self.failures}


class Controller:
    def __init__(self, controller: str, dirs: dict[str, Path]) -> None:
        self.controller = controller
        self.dirs = dirs
        self.clients = {name: ApiClient(data_dir=d, timeout_s=60.0) for name, d in dirs.items()}
        self.beater: Beater | None = None

    def handle(self, cmd: dict[str, Any]) -> Any:
        op = cmd.get("op")
        match op:
            case "place":
                spec = msgspec.convert(cmd["spec"], InstanceSpec)
                return self._client(cmd).place(
                    spec,
                    controller=self.controller,
                    generation=int(cmd["generation"]),
                    start=bool(cmd.get("start", False)),
                )
            case "start":
                return self._client(cmd).start(cmd["instance"])
            case "stop":
                return self._client(cmd).stop(cmd["instance"])
            case "status":
                return self._client(cmd).status(cmd["instance"])
            case "list":
                return self._client(cmd).list()
            case "node":
                return self._client(cmd).node()
            case "heartbeat":
                names = [cmd["node"]] if "node" in cmd else list(self.clients)
                return [self.clients[n].heartbeat(self.controller) for n in names]
            case "beat":
                if self.beater is not None:
                    raise ValueError("op beat: already beating; send silence first")
                self.beater = Beater(self.controller, self.dirs, float(cmd["every_s"]))
                return {"every_s": self.beater.every_s}
            case "silence":
                beater, self.beater = self.beater, None
                return beater.silence() if beater is not None else {"beats": 0, "failures": []}
            case "quit":
                return None
        raise ValueError(
            f"op {op!r}: allowed place, start, stop, status, list, node, heartbeat, "
            "beat, silence, quit"
        )

    def _client(self, cmd: dict[str, Any]) -> ApiClient:
        name = cmd.get("node")
        if name not in self.clients:
            raise ValueError(f"node {name!r}: allowed {', '.join(sorted(self.clients))}")
        return self.clients[name]

    def close(self) -> None:
        if self.beater is not None:
            self.beater.silence()
        for client in self.clients.values():
            client.close()


def error_of(e: Exception) -> dict[str, Any]:
    return {
        "type": type(e).__name__,
        "code": getattr(e, "code", None),
        "status": getattr(e, "status", None),
        "field": getattr(e, "field", None),
        "message": str(e),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controller", required=True)
    parser.add_argument("nodes", nargs="+", metavar="NAME=DATA_DIR")
    args = parser.parse_args()
    dirs = {}
    for item in args.nodes:
        name, sep, where = item.partition("=")
        if not sep:
            parser.error(f"{item!r}: expected NAME=DATA_DIR")
        dirs[name] = Path(where)
    controller = Controller(args.controller, dirs)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                cmd = json.loads(line)
                reply = {"ok": True, "answer": msgspec.to_builtins(controller.handle(cmd))}
            except Exception as e:
                reply = {"ok": False, "error": error_of(e)}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
            if reply["ok"] and cmd.get("op") == "quit":
                break
    finally:
        controller.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
