"""``infervisor run``: a node in the foreground until SIGINT or SIGTERM.

On start the node rebuilds itself from its chain (instances wanted running
are started again, stopped ones stay stopped); instances in the config that
the chain does not know yet are placed, and started when ``start = true``.
On SIGINT/SIGTERM, managed servers are stopped gracefully (recorded, and
still wanted running for the next start) and the process exits 0.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from infervisor.actors.node import Node
from infervisor.adapters.errors import AdapterError
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.spec import instance_id

from .config import ModelEntryConfig, NodeConfig

__all__ = ["register_models", "run_node"]

log = logging.getLogger(__name__)


def register_models(registry: ModelRegistry, models: list[ModelEntryConfig]) -> None:
    """Make sure every configured model is in the registry (generating tiny ones if asked).

    Raises:
        RegistryError: a file is missing or fails its digest.
    """
    for model in models:
        file = registry.root / model.path
        if model.generate_tiny and not file.exists():
            from .tinymodel import generate_tiny_gguf  # noqa: PLC0415 - needs the llamacpp extra

            file.parent.mkdir(parents=True, exist_ok=True)
            generate_tiny_gguf(file)
        if model.name not in registry.names():
            registry.adopt(
                model.name,
                file,
                format=model.format,
                ollama_tag=model.ollama_tag,
                draft=model.draft,
            )


def place_new(node: Node, config: NodeConfig, say: Callable[[str], None]) -> None:
    """Place (and start when asked) the configured instances the chain does not know."""
    known = {view.instance_id for view in node.list()}
    for entry in config.instances:
        spec = entry.spec()
        iid = instance_id(spec, config.node.node_id)
        if iid in known:
            continue
        node.place(spec)
        say(f"placed {iid}")
        if entry.start:
            try:
                node.start(iid)
                say(f"started {iid}")
            except AdapterError as e:
                say(f"could not start {iid}: {e}")


def run_node(config: NodeConfig, say: Callable[[str], None]) -> int:
    """Run until SIGINT or SIGTERM; returns the exit status (0 after a clean stop)."""
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        say(f"received {signal.Signals(signum).name}: stopping managed servers")
        done.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        register_models(ModelRegistry(config.node.registry_path), config.models)
        node = Node.open(config.node)
        try:
            for view in node.list():
                say(f"resumed {view.instance_id}: {view.lifecycle} (wanted {view.desired})")
            place_new(node, config, say)
            say(f"node {config.node.node_id} running; chain {config.node.chain_path}")
            done.wait()
        finally:
            node.shutdown(reason="signal")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    say("stopped")
    return 0
