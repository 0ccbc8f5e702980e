"""A llama-protocol server that exits 0 by itself once the file ``exit-now`` appears
in its working directory (a one-shot run ending while no node is alive).

Takes llama-server's flags; /health follows the ``health`` file (see fault_common).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from fault_common import parse_args, serve


def watch() -> None:
    while not Path("exit-now").exists():
        time.sleep(0.02)
    os._exit(0)


if __name__ == "__main__":
    threading.Thread(target=watch, daemon=True).start()
    serve(parse_args())
