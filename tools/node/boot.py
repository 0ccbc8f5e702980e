"""Before the node opens: what ``infervisor run`` checks and sets up first.

The preflight (model files, the extras, folders) finds what it can before
anything is created; then the run lock is held (:mod:`.lock`), Python logging
goes to the data_dir's log, the descriptor limit is raised, the control API's
listeners open (answering 503 "starting"), the chain is checked to be this
node's, the models are registered (:mod:`.models`) and the node opens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pykka

from infervisor.actors.errors import NodeError, WitnessConflict
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.proc.identity import own_age_s
from infervisor.adapters.proc.output import open_private
from infervisor.adapters.registry import ModelFormat, ModelRegistry
from infervisor.adapters.spec import Flavor
from infervisor.chain import ChainError, SqliteChain, StoredEvent
from infervisor.chain.errors import ChainTampered

from ..api.errors import ApiError
from ..api.serving.server import ApiServer
from ..servers.extras import install_hint, missing_modules
from .config import ApiConfig, NodeConfig
from .lock import ChainRefused, RunError
from .models import register_models

if TYPE_CHECKING:
    from ..front.server import FrontServer

__all__ = [
    "LOG_FILE",
    "check_chain_owner",
    "diagnostics_to",
    "listen_for_clients",
    "listen_for_operators",
    "open_node",
    "preflight",
    "raise_descriptor_limit",
]

#: Where Python logging goes (appended, with levels) while a node runs there.
LOG_FILE = "node.log"

#: Descriptors the node needs beyond the API's connections: the chain, logs,
#: pipes and pidfds of its servers, probes (a margin, not a count).
DESCRIPTOR_MARGIN = 512

log = logging.getLogger(__name__)


def preflight(config: NodeConfig) -> None:
    """What can be checked before anything is created: every model file to
    register exists, and the extra that generates a tiny model is installed.

    Raises:
        RunError: naming the model, its file, or the extra to install.
    """
    registry = config.node.registry_path
    for folder, key in ((Path(config.node.data_dir), "data_dir"), (registry, "registry_dir")):
        _check_creatable(folder, key)
    for model in config.models:
        if (registry / f"{model.name}.toml").is_file() or model.format is ModelFormat.OLLAMA:
            continue  # registered already: checked when an instance is placed or started
        file = registry / model.path
        if model.generate_tiny and not file.resolve().is_relative_to(registry.resolve()):
            raise RunError(
                f"[[models]] {model.name}: path {model.path!r} is outside the registry root "
                f"{registry.resolve()}: refused before writing"
            )
        if model.generate_tiny:
            if not file.exists() and (absent := missing_modules(Flavor.LLAMACPP)):
                raise RunError(
                    f"[[models]] {model.name}: generate_tiny needs the llamacpp extra: "
                    f"{install_hint(Flavor.LLAMACPP)} (missing: {', '.join(absent)})"
                )
        elif not file.exists():
            raise RunError(
                f"[[models]] {model.name}: {file} does not exist: put the model there "
                "(path is relative to the registry folder), or set generate_tiny = true"
            )


def raise_descriptor_limit(api: ApiConfig) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit (logged),
    so the node is not the first to run out of descriptors (issue 17: 1,100
    API connections took a node with the usual soft limit of 1,024 to its
    end); warn when even the hard limit leaves too little beside the API's
    caps. Managed servers get limits of their own (adapters/proc/limits.py).

    Returns:
        The soft limit now in force (descriptors).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.warning("cannot raise the descriptor limit (RLIMIT_NOFILE) to %s: %s", hard, e)
        else:
            log.info("raised the descriptor limit (RLIMIT_NOFILE) from %s to %s", soft, hard)
            soft = hard
    needed = (2 if api.tcp else 1) * api.max_connections + DESCRIPTOR_MARGIN
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the descriptor limit is %s; the API's listeners may hold %s connections "
            "([api] max_connections each) and the node needs about %s more: lower "
            "max_connections or raise the hard limit (ulimit -Hn, systemd LimitNOFILE=)",
            soft,
            needed - DESCRIPTOR_MARGIN,
            DESCRIPTOR_MARGIN,
        )
    return soft


def _check_creatable(folder: Path, key: str) -> None:
    """Refuse a folder that cannot be created because a file is in its way."""
    found = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if found is not None and not found.is_dir():
        raise RunError(f"{key} {folder}: cannot create it: {found} is not a folder")


@contextlib.contextmanager
def diagnostics_to(path: Path) -> Iterator[Path]:
    """Send Python logging to ``path`` (appended, with levels) instead of the
    terminal while the block runs; the root logger's level is kept.

    Raises:
        RunError: the file cannot be opened.
    """
    try:
        # Created 0600 whatever the umask (it logs specs and requests), then appended to.
        os.close(open_private(str(path), os.O_WRONLY | os.O_APPEND))
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as e:
        raise RunError(f"{path}: cannot write the log there: {e.strerror or e}") from e
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    terminal = [h for h in root.handlers if _is_terminal(h)]
    for h in terminal:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for h in terminal:
            root.addHandler(h)


def _is_terminal(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return isinstance(handler, logging.StreamHandler) and stream in (sys.stderr, sys.stdout)


def listen_for_operators(config: NodeConfig) -> ApiServer:
    """Open the control API (the data_dir's socket, and ``[api] tcp`` when set); it
    answers 503 "starting" until the node is open.

    Raises:
        RunError: a listener cannot be opened (socket path too long or in the way,
            the TCP port taken, a bad ``[api]`` key).
    """
    from ..api.auth import load_or_create_tokens, parse_tcp  # noqa: PLC0415
    from ..api.limits import ConnectionLimits  # noqa: PLC0415
    from ..api.metrics import NodeMetrics  # noqa: PLC0415

    settings, api = config.node, config.api
    data_dir = Path(settings.data_dir)
    try:
        tcp = tokens = None
        if api.tcp is not None:
            tcp = parse_tcp(api.tcp, allow_non_loopback=api.allow_non_loopback)
            tokens = load_or_create_tokens(data_dir, api.tokens)
        limits = ConnectionLimits(
            max_connections=api.max_connections,
            read_timeout_s=api.read_timeout_s,
            keep_alive_s=api.keep_alive_s,
        )
        server = ApiServer.listen(
            data_dir, settings.chain_path, settings.node_id, tcp=tcp, tokens=tokens, limits=limits
        )
    except ApiError as e:
        raise RunError(f"data_dir {settings.data_dir}: {e}") from e
    gate = server.ctx.gate
    server.ctx.metrics = NodeMetrics(lambda: gate.node, settings.chain_path).render
    return server


def listen_for_clients(config: NodeConfig, control: ApiServer) -> FrontServer | None:
    """Open the OpenAI-compatible front (``[front] listen``; None without ``[front]``),
    answering 503 "starting" until the node is open; its requests and tokens join the
    control API's ``/metrics``.

    Raises:
        RunError: the address cannot be bound, or the tokens file cannot be used.
    """
    front, settings = config.front, config.node
    if front is None:
        return None  # the front's modules are not even imported: a node without one pays nothing
    from ..api.auth import load_or_create_tokens, parse_tcp  # noqa: PLC0415
    from ..api.metrics import NodeMetrics  # noqa: PLC0415
    from ..front.server import FrontServer  # noqa: PLC0415

    try:
        address = parse_tcp(
            front.listen, allow_non_loopback=front.allow_non_loopback, key="front.listen"
        )
        tokens = load_or_create_tokens(Path(settings.data_dir), config.api.tokens)
        server = FrontServer.listen(front, address, tokens, settings.node_id)
    except ApiError as e:
        raise RunError(f"[front] {e}") from e
    control.ctx.own_ports[server.address.port] = "front port ([front] listen)"  # placing refuses it
    gate = control.ctx.gate
    control.ctx.metrics = NodeMetrics(
        lambda: gate.node, settings.chain_path, also=[server.collector()]
    ).render
    return server


def open_node(
    config: NodeConfig,
    on_event: Callable[[StoredEvent], None] | None = None,
    *,
    accept_witness_conflict: bool = False,
) -> Node:
    """Check the chain is this node's, register the models, open the node (the
    boot check against ``[[witnesses]]`` included; ``accept_witness_conflict``
    resumes past their refusal, recorded).

    Raises:
        ChainRefused: the chain fails its boot check, or a witness refuses it (exit 1).
        RunError: naming the chain, the model or the setting at fault.
    """
    settings = config.node
    check_chain_owner(settings)
    register_models(ModelRegistry(settings.registry_path), config.models)
    try:
        return Node.open(
            settings,
            on_event=on_event,
            witnesses=config.witness_targets(),
            accept_witness_conflict=accept_witness_conflict,
            started_before_s=own_age_s(),
        )
    except (ChainTampered, WitnessConflict) as e:
        raise ChainRefused(f"cannot open the node on {settings.data_dir}: {e}") from e
    except (ChainError, NodeError, AdapterError, OSError, ValueError, pykka.ActorDeadError) as e:
        raise RunError(f"cannot open the node on {settings.data_dir}: {e}") from e


def check_chain_owner(settings: NodeSettings) -> None:
    """Refuse a chain file that is unreadable or was written by another node id.

    Raises:
        RunError: naming the file and the node id it belongs to.
    """
    path = settings.chain_path
    if not path.exists():
        return
    try:
        with SqliteChain.open_readonly(path) as chain:
            owner = chain.node_id
    except ChainError as e:
        raise RunError(f"{e}; move it away or use another data_dir") from e
    if owner != settings.node_id:
        raise RunError(
            f"{path} is the chain of node {owner!r}, but [node] node_id is "
            f"{settings.node_id!r}: set node_id = {owner!r}, or use another data_dir"
        )
