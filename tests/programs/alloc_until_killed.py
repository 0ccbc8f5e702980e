"""A llama-protocol server that, once listening, allocates memory (8 MiB at a
time, every page written) until something kills it: an OOM kill under a
memory limit. Writes ``allocating`` when it begins."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fault_common import parse_args, serve

CHUNK = 8 << 20


def allocate() -> None:
    time.sleep(0.5)  # answer a probe or two first
    Path("allocating").write_text("yes")
    held = []
    while True:
        held.append(b"x" * CHUNK)
        time.sleep(0.01)


if __name__ == "__main__":
    args = parse_args()
    threading.Thread(target=allocate, daemon=True).start()
    serve(args)
