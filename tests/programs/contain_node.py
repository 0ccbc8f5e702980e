"""A node for the kill-after-starting test: boot, say what runs, then restart
the instance and be SIGKILLed a given time after ``instance.starting`` is durable.

Usage: contain_node.py CONFIG_JSON, with ``{"data_dir", "registry_dir",
"program", "port", "kill_after_s"}``. It opens the node (placing and starting
the instance on the first run), waits until the instance runs, prints one JSON
line ``{"iid", "pid"}`` and reads a line: ``restart`` restarts the instance
(and the node kills itself ``kill_after_s`` after the restart's
``instance.starting``), ``shutdown`` shuts the node down gracefully.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import StoredEvent
from infervisor.replay import RestartPolicy

cfg = json.loads(sys.argv[1])
armed = threading.Event()


def on_event(stored: StoredEvent) -> None:
    if armed.is_set() and stored.kind == "instance.starting":
        threading.Timer(cfg["kill_after_s"], os.kill, (os.getpid(), signal.SIGKILL)).start()


settings = NodeSettings(
    node_id="n1",
    data_dir=cfg["data_dir"],
    registry_dir=cfg["registry_dir"],
    llamacpp_program=cfg["program"],
    health_interval_s=0.1,
    reconcile_interval_s=0.5,
    stop_grace_s=2.0,
    restart=RestartPolicy(base_s=0.1, cap_s=0.5, max_restarts=1000, stable_after_s=60.0),
)


def main() -> None:
    node = Node.open(settings, on_event=on_event)
    if not node.list():
        node.registry.adopt("tiny", os.path.join(cfg["registry_dir"], "tiny.gguf"))
        spec = InstanceSpec(port=cfg["port"], role="chat", flavor=Flavor.LLAMACPP, model="tiny")
        node.start(node.place(spec))
    iid = node.list()[0].instance_id
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", 60.0)
    print(json.dumps({"iid": iid, "pid": view.pid}), flush=True)
    if sys.stdin.readline().strip() == "restart":
        armed.set()
        node.restart(iid)
        signal.pause()  # the timer ends this process
    node.shutdown()


try:
    main()
except BaseException:
    # The actors' threads would keep a node whose test has gone (a closed pipe)
    # alive for ever: end at once, as the SIGKILL this program stands for would.
    traceback.print_exc()
    os._exit(1)
