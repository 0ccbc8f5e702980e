"""CPU of the front's read of one request body (tools/front/bodies.py ``parse``:
msgspec's decode of the fields it routes by, and since stop 34 the scan for a
key given twice, tools/api/json_keys.py), this checkout against another, side
by side.

Two bodies: a typical chat request (a system and a user message, temperature
and max_tokens: 329 bytes) and one with a long prompt (a 16 KiB user message).
Each round times 20,000 parses in a fresh process of each checkout, in turns
(each pair takes the other first), so load drifting during the run weighs on
both alike; the ratio is this checkout's median over the other's.

Run: ``python bench/front_body.py [--before DIR] [--rounds 7]`` (DIR: a checkout
of another commit with its own environment, ``DIR/.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_TIMED = r"""
import sys, timeit, msgspec
from infervisor.tools.front import bodies
size = int(sys.argv[1])
body = msgspec.json.encode({"model": "chat", "messages": [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "x" * size if size else
     "What is the capital of France, and how many people live there?"}],
    "temperature": 0.7, "max_tokens": 256, "stream": True, "top_p": 0.95})
assert bodies.parse("/v1/chat/completions", body).model == "chat"
n = 20000
print(timeit.timeit(lambda: bodies.parse("/v1/chat/completions", body), number=n) / n * 1e6)
"""


def _one(python: str, size: int) -> float:
    argv = [python, "-c", _TIMED, str(size)]
    return float(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def main() -> None:
    """Print each round's microseconds per parse, the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--before", help="another checkout, with DIR/.venv/bin/python")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    other = None if args.before is None else os.path.join(args.before, ".venv/bin/python")
    for size in (0, 16384):
        here: list[float] = []
        base: list[float] = []
        for i in range(args.rounds):
            pair = [(sys.executable, here)] + ([(other, base)] if other else [])
            for python, into in pair if i % 2 == 0 else pair[::-1]:
                into.append(_one(python, size))
        what = "typical chat body" if size == 0 else f"chat body with a {size}-byte prompt"
        print(f"{what}; load {os.getloadavg()[0]:.1f}")
        print(f"  this checkout us/parse: {[round(x, 2) for x in here]}")
        if base:
            print(f"  before us/parse: {[round(x, 2) for x in base]}")
            now, before = statistics.median(here), statistics.median(base)
            added = f"+{now - before:.2f} us, {now / before:.2f}x"
            print(f"  medians {now:.2f} vs {before:.2f} us: {added}")


if __name__ == "__main__":
    main()
