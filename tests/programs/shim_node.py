"""A stand-in node for the shim tests: spawn a server through ManagedProcess.spawn
with a launch token, print the server's identity as one JSON line, then wait
until killed (a node that dies before it could record the pid).

Usage: shim_node.py CWD TOKEN PROGRAM [ARG...]
"""

import signal
import sys

import msgspec

from infervisor.adapters.proc.handles import ManagedProcess
from infervisor.adapters.proc.plan import LaunchPlan, launch_env

cwd, token, program, *args = sys.argv[1:]
plan = LaunchPlan(program=program, args=args, env=launch_env(), cwd=cwd)
proc = ManagedProcess.spawn(plan, lambda info: None, token)
sys.stdout.buffer.write(msgspec.json.encode(proc.identity) + b"\n")
sys.stdout.flush()
while True:
    signal.pause()
