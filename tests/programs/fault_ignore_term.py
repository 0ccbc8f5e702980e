"""A llama-protocol server that ignores SIGTERM: only SIGKILL ends it.

/health follows the ``health`` file in the working directory (see fault_common).
"""

from __future__ import annotations

import signal

from fault_common import parse_args, serve

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(parse_args())
