"""Start a SIGTERM-ignoring child in this process group, report its pid, then wait.

The parent itself dies on SIGTERM; the child outlives it until SIGKILL, holding
the inherited stdout pipe open.
"""

import pathlib
import signal
import subprocess
import sys

child = subprocess.Popen(
    [sys.executable, str(pathlib.Path(__file__).with_name("ignore_sigterm.py"))]
)
print(f"child {child.pid}", flush=True)
while True:
    signal.pause()
