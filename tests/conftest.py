"""Shared fixtures: tiny models, registries, launchers and nodes.

Every node a test opens is shut down in teardown, and every test checks that
no process it started is left behind.
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import importlib
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx._transports.default as _httpx_transport
import hypothesis
import port_once  # noqa: F401 - first: it patches free_port before anyone imports it
import psutil
import pytest
from support import FAKE_GGUF, PROGRAMS, make_launcher, ollama_server

from infervisor.actors.clock import Clock, ManualClock
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.ports import free_port
from infervisor.adapters.proc.mounts import hierarchies
from infervisor.replay import RestartPolicy

# A suite started in the background by a non-interactive shell (`pytest &`, nohup,
# a CI runner's job) inherits SIGINT and SIGQUIT ignored, and so would every CLI
# it starts: the tests that end `logs -f`, `watch` and `status -w` with Ctrl-C
# (SIGINT) would then wait forever. A handler here is reset to the default in
# each child at exec, where an ignored signal would stay ignored.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# httpx makes a new SSL context for every client, with verify=True reading
# certifi's whole CA bundle: 20-45 ms of CPU each, for clients that only speak
# plain http to loopback (an ApiClient, an httpx.get in a poll loop: thousands a
# run). No test speaks TLS; in this process the default context is made once
# per (trust_env, SSL_CERT_FILE, SSL_CERT_DIR) and shared, as httpx's own
# docs suggest for a context reused across clients. Any other ``verify`` is
# httpx's own path, unchanged.
_make_ssl_context = _httpx_transport.create_ssl_context
_shared_ssl_contexts: dict[tuple[bool, str | None, str | None], ssl.SSLContext] = {}


def _ssl_context_once(
    verify: ssl.SSLContext | str | bool = True, cert: Any = None, trust_env: bool = True
) -> ssl.SSLContext:
    if verify is not True or cert is not None:
        return _make_ssl_context(verify, cert, trust_env)
    key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if key not in _shared_ssl_contexts:
        _shared_ssl_contexts[key] = _make_ssl_context(verify, cert, trust_env)
    return _shared_ssl_contexts[key]


_httpx_transport.create_ssl_context = _ssl_context_once

# Hypothesis's 200 ms deadline per example measures the machine, not the code:
# at load 10 a pure example can take longer. No deadline; speed is bench/'s.
hypothesis.settings.register_profile("suite", deadline=None)
hypothesis.settings.load_profile("suite")


def _draws_independent_of_imports() -> None:
    """Hypothesis draws about one choice in twenty from the constants written in
    every local module in ``sys.modules`` (``_get_local_constants``, 6.131 on),
    a pool that grows with each module imported: a ``derandomize=True`` test
    then drew other examples depending on which test files were collected or
    ran before it (tests/test_crash_anywhere.py passed alone, failed after
    tests/test_chain_boot.py). An empty pool makes the examples a function of
    the test alone. Private API: tests/test_hypothesis_import_order.py fails if
    an upgrade changes it."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()


_draws_independent_of_imports()


@pytest.fixture
def fake_llama(tmp_path: Path) -> str:
    """A launcher running tests/programs/fake_llama.py with llama-server's flags."""
    return make_launcher(tmp_path, PROGRAMS / "fake_llama.py")


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    """A registry folder with one small GGUF-named file (the fake server never reads it)."""
    root = tmp_path / "models"
    root.mkdir()
    (root / "tiny.gguf").write_bytes(FAKE_GGUF + bytes(40))
    return root


def _descendants() -> dict[int, bool]:
    """Every descendant of this process: pid -> whether it is a zombie.

    Read from /proc/PID/task/TID/children, the kernel's own parent links, child
    by child: about 0.1 ms a call, where psutil's ``children(recursive=True)`` reads
    the parent of every process on the host (about 2 ms, three times a test,
    2,200 tests). The same processes either way: those whose parent chain leads
    here (a child reparented to init is in neither). Where /proc has no
    ``children`` files (macOS; a kernel without CONFIG_PROC_CHILDREN), psutil.
    """
    if not os.path.exists("/proc/thread-self/children"):
        return {p.pid: _psutil_zombie(p) for p in psutil.Process().children(recursive=True)}
    found: dict[int, bool] = {}
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        tasks: list[str] = []
        with contextlib.suppress(OSError):  # the process ended meanwhile
            tasks = os.listdir(f"/proc/{parent}/task")
        for task in tasks:
            children: list[str] = []
            with (
                contextlib.suppress(OSError),  # the task ended meanwhile
                open(f"/proc/{parent}/task/{task}/children") as links,
            ):
                children = links.read().split()
            for pid in map(int, children):
                if pid not in found:
                    found[pid] = _proc_zombie(pid)
                    todo.append(pid)
    return found


def _proc_zombie(pid: int) -> bool:
    """Whether ``pid`` is a zombie (state Z in /proc/PID/stat); gone counts as one."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


def _psutil_zombie(process: psutil.Process) -> bool:
    try:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(autouse=True)
def _no_leftover_children() -> Iterator[None]:
    before = set(_descendants())
    yield

    def leftovers() -> list[int]:
        return [p for p, zombie in _descendants().items() if p not in before and not zombie]

    deadline = time.monotonic() + 60  # generous at load 10: only a bound on a hang
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftovers()
    assert not left, f"processes left behind: {left}"


class NodeFactory:
    """Opens nodes for a test and shuts every one down afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.nodes: list[Node] = []

    def settings(self, program: str, registry: Path, **overrides: Any) -> NodeSettings:
        fields: dict[str, Any] = {
            "node_id": "n1",
            "data_dir": str(self.tmp_path / "data"),
            "registry_dir": str(registry),
            "llamacpp_program": program,
            "health_interval_s": 0.2,
            "reconcile_interval_s": 0.5,
            "stop_grace_s": 5.0,
            "health_kill_grace_s": 2.0,
            "restart": RestartPolicy(base_s=0.2, cap_s=1.0, stable_after_s=60.0),
        }
        fields.update(overrides)
        return NodeSettings(**fields)

    def open(self, settings: NodeSettings, clock: Clock | None = None) -> Node:
        node = Node.open(settings, clock)
        self.nodes.append(node)
        return node

    def close_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):  # already shut down by the test
                node.shutdown()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[NodeFactory]:
    factory = NodeFactory(tmp_path)
    yield factory
    factory.close_all()


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def port() -> int:
    """A loopback port the kernel reports free now (bind it promptly)."""
    return free_port()


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's tiny random-weight GGUF, generated once per session."""
    from infervisor.tools.servers.tinymodel import generate_tiny_gguf

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    generate_tiny_gguf(path, seed=0)
    return path


@pytest.fixture
def ollama_url() -> Iterator[Callable[..., str]]:
    """``ollama_url(*models, load_seconds=0.3, **flags)`` starts an Ollama test server
    (tests/servers/ollama_server.py) and returns its URL; all are killed in teardown."""
    with contextlib.ExitStack() as stack:

        def start(*models: str, load_seconds: float = 0.3, **flags: Any) -> str:
            return stack.enter_context(
                ollama_server(*models, load_seconds=load_seconds, **flags)
            ).url

        yield start


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: twice as many workers as cores. Most tests wait on real
    processes and real time (grace periods, probes, restarts), so a core per
    worker leaves the cores idle much of the time: three workers on 2 cores kept
    1.5 of them busy (the whole suite 5 min 58 s, 528 s of CPU), four kept 1.76
    busy (4 min 46 s, 522 s of CPU; both at light load, 2026-12-03)."""
    return max(2, (os.cpu_count() or 2) * 2)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package's modules to bytecode once, before any test starts a process.

    Where PYTHONDONTWRITEBYTECODE is set (this machine's environment sets it), an
    editable install has no ``__pycache__``: each ``infervisor`` process the tests
    start compiled every module it imports from source again (0.2 s of CPU for a
    command, 0.3 s for a node; bench/cli_startup.py). compileall writes the
    bytecode whatever that variable says, and Python checks each file's source
    against it at import, so a stale one is never used."""
    for package in ("actors", "adapters", "chain", "replay", "tools"):
        for folder in importlib.import_module(f"infervisor.{package}").__path__:
            compileall.compile_dir(folder, quiet=2)  # best effort: a read-only install has its own
    _cache_rewritten_modules(session.config)


def _cache_rewritten_modules(config: pytest.Config) -> None:
    """Write pytest's rewritten bytecode of the test files and of the modules it has
    rewritten so far, once, before any worker starts.

    pytest rewrites the asserts (an AST pass) of each test file, conftest and module of
    a distribution holding a pytest plugin (hypothesis, anyio: httpx imports it) when
    it imports them, and caches the result as a pyc only where bytecode may be written:
    with PYTHONDONTWRITEBYTECODE set (this machine's environment sets it) each of the
    ``-n auto`` workers rewrote them all again, 12 s of its CPU before its first test.
    A worker reads a cached pyc whatever that variable says (checked against the
    source, so a stale one is never used), and this hook runs in xdist's controller
    before it starts the workers (xdist's own ``pytest_sessionstart`` is ``trylast``).
    pytest's rewriting functions are private: best effort, any error only leaves the
    rewriting to the workers, as before."""
    if hasattr(config, "workerinput"):
        return  # a worker: the controller wrote them
    try:
        from _pytest.assertion import rewrite  # private: used only here

        state = config.stash[rewrite.assertstate_key]
        rewritten = [
            Path(module.__file__)
            for module in list(sys.modules.values())
            if isinstance(getattr(module, "__loader__", None), rewrite.AssertionRewritingHook)
            and getattr(module, "__file__", None)
        ]
        for source in sorted({*rewritten, *Path(__file__).parent.glob("test_*.py")}):
            pyc = rewrite.get_cache_dir(source) / (source.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(source, pyc) is None and rewrite.try_makedirs(pyc.parent):
                source_hash, code = rewrite._rewrite_test(source, config)
                rewrite._write_pyc(state, code, source_hash, pyc)
    except Exception:  # best effort: see above
        return


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a slow test first, the one with the longest timeout marker
    first among them (their order otherwise kept): xdist hands whole files to
    workers in this order (``--dist loadfile --no-loadscope-reorder``:
    pyproject.toml), and a minute-long kill loop handed out last would run
    alone at the end while the other workers idle.
    Longest first is how a fixed set of jobs is spread over few workers."""
    weight: dict[object, float] = {}
    for item in items:
        if item.get_closest_marker("slow") is not None:
            limit = item.get_closest_marker("timeout")
            seconds = float(limit.args[0]) if limit is not None and limit.args else 0.0
            weight[item.path] = max(weight.get(item.path, 0.0), seconds, 1.0)
    items.sort(key=lambda item: -weight.get(item.path, 0.0))


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_cgroups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Leave no empty cgroup of the nodes this session's tests ran behind: a node
    killed on purpose does not remove its own. Only the bases of data
    directories under this session's temporary folder are touched (a base is
    named after its data directory's digest: adapters/proc/containment.py ``base_name``),
    so a suite running beside this one (another checkout, CI) keeps the empty
    ``server`` cgroup its node has just made for a launch. Only empty cgroups
    are removed (rmdir refuses any other), bottom-up; each xdist worker
    removes those of its own folder when its session ends."""
    yield
    ours = _digests(tmp_path_factory.getbasetemp())
    for hierarchy in hierarchies(*_own_cgroups()):
        with contextlib.suppress(OSError):
            for entry in os.scandir(hierarchy.own):
                if entry.is_dir() and _base_digest(entry.name) in ours:
                    for path, _, _ in os.walk(entry.path, topdown=False):
                        with contextlib.suppress(OSError):
                            os.rmdir(path)


def _digests(root: Path) -> set[str]:
    """The base-name digest of every folder under ``root`` (any may be a data directory)."""
    found = set()
    for path, _, _ in os.walk(root):
        found.add(hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:8])
    return found


def _base_digest(name: str) -> str | None:
    """The data directory digest of a node's base cgroup name (``infervisor-ID-DIGEST``)."""
    return name.rsplit("-", 1)[-1] if name.startswith("infervisor-") else None


def _own_cgroups() -> tuple[str, str]:
    try:
        return Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
    except OSError:
        return "", ""
