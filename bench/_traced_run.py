"""``infervisor run`` with a memory debug hook, for bench/rss_run.py ``--trace``.

Runs the command line's ``main`` in this process with :mod:`tracemalloc`
tracing (``--frames`` frames a block) and answers SIGUSR1 by writing, under
the path in ``INFERVISOR_TRACE_TO`` plus a counter (``.0``, ``.1``, ...), the
snapshot (``.snap``, :meth:`tracemalloc.Snapshot.dump`) and the live objects
counted by type (``.types``: ``count name`` lines, from :func:`gc.get_objects`).
The handler only sets a flag; a thread writes the files, so the node's
threads are never interrupted inside an allocation. Not a benchmark itself.

Run: ``INFERVISOR_TRACE_TO=/tmp/t python bench/_traced_run.py run CONFIG``
"""

from __future__ import annotations

import collections
import gc
import os
import signal
import sys
import threading
import tracemalloc

from infervisor.tools.cli import main

FRAMES = 12


def _writer(to: str, wake: threading.Event) -> None:
    n = 0
    while True:
        wake.wait()
        wake.clear()
        tracemalloc.take_snapshot().dump(f"{to}.{n}.snap")
        counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        with open(f"{to}.{n}.types", "w", encoding="utf-8") as out:
            out.writelines(f"{c} {name}\n" for name, c in counts.most_common())
        with open(f"{to}.{n}.done", "w", encoding="utf-8") as out:
            out.write("done\n")
        n += 1


if __name__ == "__main__":
    tracemalloc.start(FRAMES)
    wake = threading.Event()
    to = os.environ["INFERVISOR_TRACE_TO"]
    threading.Thread(target=_writer, args=(to, wake), name="trace-dump", daemon=True).start()
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    sys.argv[0] = "infervisor"
    main()
