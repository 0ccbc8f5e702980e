"""The fake llama server of tests/test_kill_loop.py, one behaviour per instance.

``KILL_LOOP_MODE`` in its environment picks it: ``flap`` answers health like
fake_llama.py, then exits 1 after a random time between ``KILL_LOOP_MIN_S``
and ``KILL_LOOP_MAX_S`` seconds; ``at_once`` exits 3 before it listens;
anything else is fake_llama.py as is (``FAKE_EXIT_AFTER`` makes a one-shot).
While the file ``kill_loop_stay`` exists in its working directory, ``flap`` and
``at_once`` serve like fake_llama.py and never exit on their own (the test
settles the node with it).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from fake_llama import main

if __name__ == "__main__":
    behaviour = os.environ.get("KILL_LOOP_MODE", "")
    if Path("kill_loop_stay").exists():
        behaviour = "stay"
    if behaviour == "at_once":
        sys.exit(3)
    if behaviour == "flap":
        low = float(os.environ.get("KILL_LOOP_MIN_S", "0.2"))
        high = float(os.environ.get("KILL_LOOP_MAX_S", "1.0"))
        os.environ["FAKE_EXIT_AFTER"] = f"{random.uniform(low, high):.3f}"
        os.environ["FAKE_EXIT_CODE"] = "1"
    main()
