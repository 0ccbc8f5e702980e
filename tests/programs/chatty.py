"""Print "tick N" every 50 ms forever, to stdout, and "started" to stderr once.

Dies on SIGTERM (the default action). Stands in for a server that keeps logging.
"""

import itertools
import sys
import time

print("started", file=sys.stderr, flush=True)
for n in itertools.count():
    print(f"tick {n}", flush=True)
    time.sleep(0.05)
