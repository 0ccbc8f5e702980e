"""Print N numbered lines (argv[1], default 5000) to stdout, then die of an
uncaught exception, so the traceback is the last thing on stderr (like a
server failing to load its model)."""

import sys

for n in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5000):
    print(f"line {n}")
sys.stdout.flush()
raise RuntimeError("model failed to load: tensor blk.0 missing")
