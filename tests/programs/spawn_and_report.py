"""A stand-in node: spawn a server with ManagedProcess.spawn, print its
identity as one JSON line, then track its descendants every 50 ms (as a node's
health tick would) until killed.

Usage: spawn_and_report.py CWD PROGRAM [ARG...]
"""

import sys
import time

import msgspec

from infervisor.adapters.proc.handles import ManagedProcess
from infervisor.adapters.proc.plan import LaunchPlan, launch_env

cwd, program, *args = sys.argv[1:]
plan = LaunchPlan(program=program, args=args, env=launch_env(), cwd=cwd)
proc = ManagedProcess.spawn(plan, lambda info: None)
sys.stdout.buffer.write(msgspec.json.encode(proc.identity) + b"\n")
sys.stdout.flush()
while True:
    proc.track_descendants()
    time.sleep(0.05)
