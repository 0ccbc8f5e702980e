"""A llama-protocol server that starts a child in its own process group.

The child ignores SIGTERM (only a group SIGKILL ends it) and its pid is
written to ``child.pid`` in the working directory before the server listens.
"""

from __future__ import annotations

import subprocess
import sys

from fault_common import parse_args, serve, write_pid

CHILD = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: signal.pause()"

if __name__ == "__main__":
    args = parse_args()
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    write_pid("child.pid", child.pid)
    serve(args)
