"""A one-shot job: takes llama-server's flags, serves nothing, exits with --code."""

from __future__ import annotations

import sys

from fault_common import parse_args

if __name__ == "__main__":
    args = parse_args(lambda p: p.add_argument("--code", type=int, default=0))
    print(f"one-shot run done, exit code {args.code}", flush=True)
    sys.exit(args.code)
