"""Crash at start (exit 1) for the first --crashes runs, then serve for good.

Runs are counted in the file ``runs`` in the working directory, which
survives restarts of the server.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fault_common import parse_args, serve

if __name__ == "__main__":
    args = parse_args(lambda p: p.add_argument("--crashes", type=int, default=2))
    runs = Path("runs")
    run = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(run))
    if run <= args.crashes:
        print(f"fatal: injected crash on run {run}", file=sys.stderr)
        sys.exit(1)
    serve(args)
