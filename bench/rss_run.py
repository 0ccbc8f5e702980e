"""RSS per adopted instance of a node run as an operator runs it: ``infervisor run``
and ``place``, measured from outside the node's process.

A fresh data dir, a config with no instance (health probes every second), and
``infervisor run CONFIG`` as its own process. Once its control API answers
and it has settled, the node process's memory is read with nothing placed;
then ``--count`` adopted llama.cpp instances are placed and started as an
operator would (``POST /v1/instances`` with ``start`` on the Unix socket,
which is what ``infervisor place --start`` sends; ``--via cli`` runs the
command itself for each one), all pointing at a few keep-alive fakes
(bench/_fake_keepalive.py, the same as bench/summary.py's: an adopted
instance's server must answer its probes). When every one is running with a
probe verdict ``up``, it settles ``--settle`` seconds (a few probe rounds)
and the memory is read again. Printed per instance, (placed - empty) / N:

- **RSS**: ``VmRSS`` of /proc/PID/status (what psutil and ``ps`` report);
- **PSS**: ``Pss`` of /proc/PID/smaps_rollup (shared pages divided among
  their users: the shared libraries weigh little);
- **USS**: ``Private_Clean + Private_Dirty`` of smaps_rollup (what ending the
  process would give back);

and the node's thread count. Target (issue 22): RSS <= 200 KiB per instance.

With ``--before DIR`` (another checkout with its own ``DIR/.venv``) each
count runs both checkouts' nodes in turns, ``--rounds`` times, so a load that
drifts weighs on both alike.

Run: ``python bench/rss_run.py [--counts 300,1000] [--rounds 1] [--before DIR]``
(about 40 s a node at 300, 90 s at 1,000, on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
from _harness import (
    FAKE_KEEPALIVE,
    FAKE_LLAMA,
    machine,
    node_answers,
    reaped_children,
    servers,
    table,
    workdir,
)

from infervisor.tools.api.client import ApiClient

HERE = Path(sys.executable).parent / "infervisor"
TRACED = Path(__file__).resolve().parent / "_traced_run.py"
FAKES = 3
READY_S = 120.0
TARGET_KIB = 200


@dataclass(frozen=True)
class Memory:
    """One reading of a process's memory, bytes, and its thread count."""

    rss: int
    pss: int
    uss: int
    kinds: dict[str, int]
    threads: int

    @classmethod
    def of(cls, pid: int) -> Memory:
        status = _fields(Path(f"/proc/{pid}/status"))
        rollup = _fields(Path(f"/proc/{pid}/smaps_rollup"))
        return cls(
            rss=status["VmRSS"],
            pss=rollup["Pss"],
            uss=rollup["Private_Clean"] + rollup["Private_Dirty"],
            kinds=by_mapping(pid),
            threads=int(Path(f"/proc/{pid}/status").read_text().split("Threads:")[1].split()[0]),
        )


def by_mapping(pid: int) -> dict[str, int]:
    """Resident bytes of the process by kind of mapping (/proc/PID/smaps):

    - ``stacks``: thread stacks, the anonymous mappings the size of a thread's
      stack (``ulimit -s``: what pthreads give each thread);
    - ``malloc``: the C heap, ``[heap]`` and glibc's other arenas (an anonymous
      read-write mapping followed by its reserved rest, 64 MiB together);
    - ``anon``: other anonymous memory (pymalloc's arenas, large blocks);
    - ``files``: mapped files (the interpreter, libraries, SQLite's shm)."""
    stack_kib = resource.getrlimit(resource.RLIMIT_STACK)[0] // 1024
    maps: list[tuple[str, str, int, int]] = []  # (path, perms, size KiB, rss KiB)
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if not line[0].isupper():  # a mapping's first line: range, perms, offset, dev, inode, path
            maps.append((head[5] if len(head) > 5 else "", head[1], 0, 0))
        elif head[0] in ("Size:", "Rss:"):
            path, perms, size, rss = maps[-1]
            value = int(head[1])
            maps[-1] = (
                (path, perms, value, rss) if head[0] == "Size:" else (path, perms, size, value)
            )
    out = dict.fromkeys(("stacks", "malloc", "anon", "files"), 0)
    for i, (path, _perms, size, rss) in enumerate(maps):
        after = maps[i + 1] if i + 1 < len(maps) else ("-", "", 0, 0)
        if path == "[heap]" or (
            not path and after[0] == "" and after[1] == "---p" and size + after[2] == 65536
        ):
            kind = "malloc"
        elif not path and size == stack_kib:
            kind = "stacks"
        elif not path:
            kind = "anon"
        elif path.startswith("["):
            continue  # [stack], [vdso], [vvar]
        else:
            kind = "files"
        out[kind] += rss * 1024
    return out


def _fields(path: Path) -> dict[str, int]:
    """The ``Name:  123 kB`` lines of a /proc file, in bytes."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[name] = int(parts[0]) * 1024
    return out


def write_config(root: Path) -> Path:
    data = root / "data"
    config = root / "node.toml"
    config.write_text(
        "[node]\n"
        'node_id = "bench"\n'
        f'data_dir = "{data}"\n'
        "health_interval_s = 1.0\n"
        "reconcile_interval_s = 5.0\n"
        "probe_timeout_s = 5.0\n"
    )
    return config


@contextlib.contextmanager
def running(
    program: Path, root: Path, trace: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``program run`` on a fresh data dir under ``root``, once its API answers;
    SIGTERM (a graceful stop) at the end. With ``trace``, the node runs under
    bench/_traced_run.py in ``program``'s environment, dumping to ``trace``."""
    config = write_config(root)
    log = (root / "node.out").open("wb")
    argv = [str(program), "run", str(config)]
    env = dict(os.environ)
    if trace is not None:
        argv = [str(program.parent / "python"), str(TRACED), *argv[1:]]
        env["INFERVISOR_TRACE_TO"] = str(trace)
    node = subprocess.Popen(
        argv, cwd=root, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env
    )
    try:
        deadline = time.monotonic() + READY_S
        while not node_answers(root / "data"):
            if node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{program} run: no answer (exit {node.returncode})")
            time.sleep(0.05)
        yield node
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(READY_S)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
        log.close()


def place_all(program: Path, data: Path, ports: list[int], count: int, via: str) -> None:
    """Place and start ``count`` adopted instances, 4 callers at a time."""

    def by_api(i: int) -> None:
        # the body and headers `infervisor place --start` sends (only the keys set,
        # so a checkout of another version takes it too), on a connection of its own
        port = ports[i % len(ports)]
        spec = {"role": f"idle{i}", "flavor": "llamacpp", "mode": "adopted", "port": port}
        body = {"spec": spec, "controller": None, "generation": 0, "start": True}
        headers = {"idempotency-key": uuid.uuid4().hex}
        transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://infervisor", timeout=60) as c:
            answer = c.post("/v1/instances", json=body, headers=headers)
        if answer.status_code != 200 or answer.json().get("start_error"):
            raise RuntimeError(f"idle{i}: {answer.status_code} {answer.text}")

    def by_cli(i: int) -> None:
        argv = [str(program), "place", str(data), "--role", f"idle{i}", "--flavor", "llamacpp"]
        argv += ["--mode", "adopted", "--port", str(ports[i % len(ports)]), "--start"]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(by_api if via == "api" else by_cli, range(count)))


def wait_supervised(data: Path, count: int) -> None:
    """Until ``count`` instances are running with an ``up`` verdict."""
    deadline = time.monotonic() + READY_S
    with ApiClient(data, timeout_s=60.0) as client:
        while True:
            views = client.list()
            up = sum(1 for v in views if v.lifecycle == "running" and v.health == "up")
            if up >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {up} of {count} instances running and up")
            time.sleep(0.5)


def measure(
    program: Path, ports: list[int], count: int, settle: float, via: str, trace: bool = False
) -> dict[str, float]:
    """One node: its memory empty and with ``count`` adopted instances, KiB per
    instance. With ``trace``, prints where the Python heap grew (tracemalloc,
    by line) and which objects were added (by type), per instance."""
    with workdir("rss-run") as root:
        to = root / "trace" if trace else None
        with running(program, root, to) as node:
            time.sleep(settle)  # the empty node settles: its first checkpoint, its threads
            empty = Memory.of(node.pid)
            _dump(node, to, 0)
            place_all(program, root / "data", ports, count, via)
            wait_supervised(root / "data", count)
            time.sleep(settle)  # a few probe rounds
            full = Memory.of(node.pid)
            _dump(node, to, 1)
        if to is not None:
            print_trace(to, count)
    return {
        "rss": (full.rss - empty.rss) / count / 1024,
        "pss": (full.pss - empty.pss) / count / 1024,
        "uss": (full.uss - empty.uss) / count / 1024,
        **{k: (full.kinds[k] - empty.kinds[k]) / count / 1024 for k in full.kinds},
        "empty_mib": empty.rss / 2**20,
        "whole": full.rss / count / 1024,
        "threads": full.threads - empty.threads,
        "load": os.getloadavg()[0],
    }


def _dump(node: subprocess.Popen[bytes], to: Path | None, n: int) -> None:
    """Ask a traced node for its snapshot ``n`` and wait for it."""
    if to is None:
        return
    node.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + READY_S
    while not Path(f"{to}.{n}.done").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the traced node wrote no snapshot")
        time.sleep(0.1)


def print_trace(to: Path, count: int, top: int = 15) -> None:
    """The heap's growth between the two snapshots by line, and the objects
    added by type, per instance."""
    import tracemalloc  # noqa: PLC0415 - the trace mode only

    before = tracemalloc.Snapshot.load(f"{to}.0.snap")
    after = tracemalloc.Snapshot.load(f"{to}.1.snap")
    grew = after.compare_to(before, "lineno")
    total = sum(d.size_diff for d in grew)
    print(f"traced Python heap: +{total / count / 1024:.1f} KiB per instance; by line:")
    for d in grew[:top]:
        frame = d.traceback[0]
        print(
            f"  {d.size_diff / count:8.0f} B/inst {d.count_diff / count:6.1f} blocks/inst  "
            f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
        )
    old, new = _types(f"{to}.0.types"), _types(f"{to}.1.types")
    added = sorted(((new[t] - old.get(t, 0), t) for t in new), reverse=True)[:top]
    print("objects added per instance (gc.get_objects, by type):")
    print("  " + ", ".join(f"{t} {c / count:.1f}" for c, t in added))


def _types(path: str) -> dict[str, int]:
    out = {}
    for line in Path(path).read_text().splitlines():
        c, _, name = line.partition(" ")
        out[name] = int(c)
    return out


def rss_per_instance(root: Path, count: int, settle: float = 5.0) -> dict[str, float]:
    """This checkout's node at ``count`` adopted instances placed through the API
    (for bench/summary.py): the :func:`measure` figures, its own fakes."""
    with servers(FAKE_KEEPALIVE, FAKES, root) as fleet:
        return measure(HERE, [p for p, _ in fleet], count, settle, "api")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="300,1000", help="instances placed, comma-separated")
    ap.add_argument("--rounds", type=int, default=1, help="nodes per count and checkout")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds before each reading")
    ap.add_argument("--via", choices=["api", "cli"], default="api", help="how to place")
    ap.add_argument("--before", type=Path, help="another checkout with its own .venv")
    ap.add_argument(
        "--fake",
        choices=["keepalive", "tests"],
        default="keepalive",
        help="the fakes adopted: bench/_fake_keepalive.py, or the tests' HTTP/1.0 "
        "fake_llama.py (a new connection per probe)",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="run each node under tracemalloc (bench/_traced_run.py) and print where its "
        "Python heap grew (its RSS figures are then tracemalloc's too)",
    )
    args = ap.parse_args()
    programs = {"this": HERE}
    if args.before is not None:
        programs["before"] = args.before / ".venv" / "bin" / "infervisor"
    print(f"# {machine()}", flush=True)
    rows: list[list[object]] = []
    fake = FAKE_KEEPALIVE if args.fake == "keepalive" else FAKE_LLAMA
    with reaped_children(), workdir("rss") as root, servers(fake, FAKES, root) as fleet:
        ports = [p for p, _ in fleet]
        for count in (int(n) for n in args.counts.split(",")):
            got: dict[str, list[dict[str, float]]] = {name: [] for name in programs}
            names = list(programs)
            for i in range(args.rounds):
                for name in names[i % 2 :] + names[: i % 2]:
                    r = measure(programs[name], ports, count, args.settle, args.via, args.trace)
                    got[name].append(r)
                    print(f"{name} {count}: {_line(r)}", flush=True)
            for name, results in got.items():
                rows.append([f"{name}, {count} adopted", *_medians(results)])
    print(
        table(
            [
                "node",
                "RSS KiB/inst",
                "PSS KiB/inst",
                "USS KiB/inst",
                "stacks",
                "C heap",
                "other anon",
                "empty MiB",
                "+threads",
            ],
            rows,
        )
    )
    print(f"target: RSS <= {TARGET_KIB} KiB per instance; load now {os.getloadavg()[0]:.1f}")


def _line(r: dict[str, float]) -> str:
    return (
        f"RSS {r['rss']:.0f} KiB/inst, PSS {r['pss']:.0f}, USS {r['uss']:.0f}, "
        f"of it: thread stacks {r['stacks']:.0f}, C heap {r['malloc']:.0f}, "
        f"other anonymous {r['anon']:.0f}, files {r['files']:.0f}; "
        f"empty {r['empty_mib']:.1f} MiB, +{r['threads']:.0f} threads, "
        f"whole RSS / N {r['whole']:.0f} KiB, load {r['load']:.1f}"
    )


def _medians(results: list[dict[str, float]]) -> list[object]:
    return [
        statistics.median(r[k] for r in results)
        for k in ("rss", "pss", "uss", "stacks", "malloc", "anon", "empty_mib", "threads")
    ]


if __name__ == "__main__":
    main()
