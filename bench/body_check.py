"""CPU of the control API's check of one request body (tools/api/strict.py
``_check``: msgspec's strict decode, the 64-bit and depth walk, and since stop 34
the scan for a key given twice), this checkout against another, side by side.

The body is a typical placement (286 bytes: a spec with env, restart overrides
and residency fields, a controller and a generation). Each round times 20,000
checks in a fresh process of each checkout, in turns (each pair takes the other
first), so load drifting during the run weighs on both alike; the ratio is this
checkout's median over the other's.

Run: ``python bench/body_check.py [--before DIR] [--rounds 7]`` (DIR: a checkout
of another commit with its own environment, ``DIR/.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_TIMED = r"""
import timeit, msgspec
from infervisor.tools.api import strict
from infervisor.tools.api.wire import PlaceRequest
body = msgspec.json.encode({"spec": {"role": "chat", "flavor": "llamacpp", "port": 18741,
    "model": "tiny", "ctx_size": 4096, "env": {"LLAMA_ARG_BATCH": "512",
    "CUDA_VISIBLE_DEVICES": "0"}, "restart": {"max_restarts": 5, "base_s": 1.0},
    "on_demand": True, "idle_ttl_s": 600, "priority": 10}, "controller": "ctl-1",
    "generation": 7, "start": True})
scope = {"headers": [(b"content-type", b"application/json")]}
assert strict._check(scope, body, PlaceRequest) is None
n = 20000
print(timeit.timeit(lambda: strict._check(scope, body, PlaceRequest), number=n) / n * 1e6)
"""


def _one(python: str) -> float:
    done = subprocess.run([python, "-c", _TIMED], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def main() -> None:
    """Print each round's microseconds per check, the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--before", help="another checkout, with DIR/.venv/bin/python")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    here: list[float] = []
    base: list[float] = []
    other = None if args.before is None else os.path.join(args.before, ".venv/bin/python")
    for i in range(args.rounds):
        pair = [(sys.executable, here)] + ([(other, base)] if other else [])
        for python, into in pair if i % 2 == 0 else pair[::-1]:
            into.append(_one(python))
    print(f"load {os.getloadavg()[0]:.1f}; this checkout us/check: {[round(x, 2) for x in here]}")
    if base:
        print(f"before us/check: {[round(x, 2) for x in base]}")
        now, before = statistics.median(here), statistics.median(base)
        print(f"medians {now:.2f} vs {before:.2f} us: {now / before:.2f}x")


if __name__ == "__main__":
    main()
