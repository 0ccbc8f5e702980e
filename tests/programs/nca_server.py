"""A llama-protocol server for tests/test_node_crash_anywhere.py, steered by files
in its working directory (read with fault_common's conventions):

- ``health``: what /health answers (``ok``, ``fail``, ...; see fault_common);
- ``bind``: read once at start, the host to listen on whatever ``--host`` says
  (``0.0.0.0``: a server that listens beyond loopback);
- ``exit-now``: once it appears, the file is removed and the server exits 0
  (a one-shot run that ends cleanly).

Takes llama-server's flags (-m --host --port -c --alias -md).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from fault_common import parse_args, serve


def watch() -> None:
    flag = Path("exit-now")
    while not flag.exists():
        time.sleep(0.02)
    flag.unlink(missing_ok=True)
    os._exit(0)


if __name__ == "__main__":
    args = parse_args()
    bind = Path("bind")
    host = bind.read_text().strip() if bind.exists() else ""
    threading.Thread(target=watch, daemon=True).start()
    serve(args, host=host)
