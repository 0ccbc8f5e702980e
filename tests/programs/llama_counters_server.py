"""llama.cpp's real server (the one embedded in xllamacpp) with its counter
endpoints chosen: ``--metrics`` on and ``/slots`` off, as llama-server runs with
``--metrics --no-slots``. The project's launcher passes neither flag (``/slots``
is on by default, ``/metrics`` off), so the ``/metrics`` reading of
adapters/activity.py is tested against this program.

Command line: the launcher's flags (``-m``, ``--port``, ...), served until SIGTERM.
Prints ``READY`` once the model is loaded.
"""

from __future__ import annotations

import signal
import sys

import xllamacpp

from infervisor.tools.servers import launcher


def main() -> int:
    args = launcher.parse_args(sys.argv[1:])
    assert args is not None
    params = launcher._build_params(xllamacpp, args)
    params.endpoint_metrics = True  # --metrics
    params.endpoint_slots = False  # --no-slots
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    server = xllamacpp.Server(params)  # blocks until the model is loaded
    print("READY", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    del server
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
