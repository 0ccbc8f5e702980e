"""A node that demands its way into an eviction, for the kill test of
tests/test_residency_crash.py: it opens the node of SETTINGS (a JSON object of
NodeSettings fields), demands the instances named in DEMANDS (JSON list of
instance ids, in order; ``start:ID``: an operator's start verb instead;
``crash:ID``: its server killed with SIGKILL, then waits until its restart is
scheduled) and prints ``demanded ID`` after each. The last one evicts; the test kills this
process (SIGKILL) while the victim's stop is in flight (its server ignores
SIGTERM).

Usage: residency_node.py SETTINGS DEMANDS
"""

import json
import os
import signal
import sys
import time

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.replay import RestartPolicy

fields = json.loads(sys.argv[1])
fields["restart"] = RestartPolicy(**fields["restart"])
node = Node.open(NodeSettings(**fields))
for asked in json.loads(sys.argv[2]):
    verb, _, iid = asked.rpartition(":")
    if verb == "start":
        view = node.start(iid, by="operator:uid=1(alice)")
    elif verb == "crash":
        pid = node.status(iid).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        while (view := node.status(iid)).lifecycle != "restarting":
            time.sleep(0.05)
    else:
        view = node.demand(iid, request=f"req-{iid[:6]}", model="m", by="front", timeout_s=60)
    print("demanded", iid, view.lifecycle, flush=True)
print("done", flush=True)
sys.stdin.read()  # held until killed
