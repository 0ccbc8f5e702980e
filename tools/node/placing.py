"""Once the node is open: what the chain brought back, and the configured
instances it does not know yet placed (and started) one by one.

One bad instance never takes the node down: one the node refuses (a serve
program missing, its port taken, no memory left) is reported in one line and
the others run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pykka

from infervisor.actors.core.config_hold import Outcome, Recorded, decide_config_entry
from infervisor.actors.errors import NodeError
from infervisor.actors.node import Node
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode, instance_id
from infervisor.chain import SqliteChain
from infervisor.replay import events as ev

from ..clikit.wanted import state_words
from ..servers.extras import install_hint, missing_extra
from .config import InstanceEntry, NodeConfig

__all__ = ["PLACE_BATCH", "place_new", "report_resumed"]

Say = Callable[[str], None]


def report_resumed(node: Node, config: NodeConfig, say: Say) -> None:
    """Say what the chain brought back, and where it and the config disagree."""
    recorded = node.rebuild().instances
    supervised = {view.instance_id: view for view in node.list()}
    configured = {instance_id(e.spec(), config.node.node_id): e for e in config.instances}
    for iid, inst in sorted(recorded.items()):
        view = supervised.get(iid)
        if view is None:
            say(f"warning: {iid} is in the chain but not supervised: see the error above")
            continue
        say(f"resumed {iid}: {state_words(view)}")
        entry = configured.get(iid)
        if entry is None:
            say(f"note: {iid} is not in the config; it stays as the chain says")
            continue
        wanted = msgspec.to_builtins(entry.spec())
        changed = sorted(k for k, v in wanted.items() if inst.spec.get(k) != v)
        if changed:
            say(
                f"warning: {iid}: the config changed {', '.join(changed)} since the instance "
                "was placed; the recorded spec is used"
            )


def place_new(
    node: Node,
    config: NodeConfig,
    say: Say,
    *,
    stop_requested: Callable[[], bool] = lambda: False,
) -> list[str]:
    """Place (and start when asked) the configured instances the chain does not
    know. They are placed in batches (:meth:`Node.place_many`: admissions side
    by side, each batch's events in one transaction), in the config's order, so of two
    that want one address the first wins; then started one at a time in that
    order (a memory budget admits the first ones). One refused is said in one
    line and the rest go on. Returns the lines of the refusals.

    One the chain records unloaded since its last placement is held unloaded
    while its entry is the spec that placement recorded, and placed again,
    said loudly, once the entry changes (:mod:`infervisor.actors.core.config_hold`):
    the chain and the config alone decide, so every boot decides the same."""
    new = _to_place(node, config, say)
    refused: list[str] = []

    def refuse(n: int, spec: InstanceSpec, problem: str) -> None:
        line = f"[[instances]] #{n} ({spec.role} on port {spec.port}): {problem}"
        say(f"refused {line}")
        refused.append(line)

    placed: list[tuple[int, bool, InstanceSpec, str]] = []
    for first in range(0, len(new), PLACE_BATCH):
        if stop_requested():
            return refused
        batch = new[first : first + PLACE_BATCH]
        answers = node.place_many([spec for _, _, spec in batch], source="config")
        for (n, entry, spec), answer in zip(batch, answers, strict=True):
            if isinstance(answer, AdapterError | NodeError | pykka.ActorDeadError):
                refuse(n, spec, f"not placed: {_with_hint(config, spec, answer)}")
                continue
            if isinstance(answer, Exception):
                raise answer  # a bug, not a refusal: as a lone placement would
            say(f"placed {answer.instance_id}")
            # An on-demand instance rests until a request or a start asks for it.
            placed.append((n, entry.start and not spec.on_demand, spec, answer.instance_id))
    for n, start, spec, iid in placed:
        if stop_requested():
            break
        if start and (problem := _start_one(node, config, spec, iid, say)):
            refuse(n, spec, problem)
    return refused


def _to_place(
    node: Node, config: NodeConfig, say: Say
) -> list[tuple[int, InstanceEntry, InstanceSpec]]:
    """The config's entries to place now, numbered from 1 in the config's order:
    those the node has not got, less those held unloaded (each hold and each
    placement again after an unload said in one line)."""
    known = set(node.rebuild().instances)
    unknown = [
        (n, entry, entry.spec(), iid)
        for n, entry in enumerate(config.instances, 1)
        if (iid := instance_id(entry.spec(), config.node.node_id)) not in known
    ]
    records = _recorded(Path(node.settings.chain_path), [iid for *_, iid in unknown])
    new: list[tuple[int, InstanceEntry, InstanceSpec]] = []
    for n, entry, spec, iid in unknown:
        verdict = decide_config_entry(iid, msgspec.to_builtins(spec), records.get(iid))
        if verdict.note:
            say(verdict.note)
        if verdict.outcome is Outcome.PLACE:
            new.append((n, entry, spec))
    return new


def _recorded(chain_path: Path, iids: list[str]) -> dict[str, Recorded]:
    """Per id of ``iids`` the chain has ever placed: its last placement's spec and
    an unload after it. One read of the placements and unloads (the chain's kind
    index, one connection), however many ids the config lists."""
    found: dict[str, Recorded] = {}
    wanted = set(iids)
    if not wanted:
        return found
    kinds = ("instance.placed", "instance.unloaded")
    with SqliteChain.open_readonly(chain_path) as chain:
        for stored in chain.events(kinds=kinds):
            iid = stored.subject
            if iid not in wanted:
                continue
            event = ev.decode_event(stored)
            if isinstance(event, ev.Placed):
                found[iid] = Recorded(spec=dict(event.spec))
            elif isinstance(event, ev.Unloaded) and iid in found:
                found[iid] = Recorded(
                    spec=found[iid].spec, unloaded_seq=stored.seq, unloaded_by=event.by
                )
    return found


#: Configured instances placed at once (each batch is one round of admissions).
PLACE_BATCH = 64


def _start_one(node: Node, config: NodeConfig, spec: InstanceSpec, iid: str, say: Say) -> str:
    """Start one placed instance; what went wrong ("" if nothing)."""
    try:
        view = node.start(iid, by="config")
    except (AdapterError, NodeError, pykka.ActorDeadError) as e:
        return f"placed as {iid} but not started: {_with_hint(config, spec, e)}"
    pid = f"pid {view.pid}, " if view.pid is not None else ""
    say(f"started {iid}: {view.lifecycle}, {pid}{view.endpoint}")
    return ""


def _with_hint(config: NodeConfig, spec: InstanceSpec, error: Exception) -> str:
    """The error, and the extra to install when the flavor's server is missing."""
    message = str(error) or type(error).__name__
    if spec.mode is not Mode.MANAGED or spec.flavor is Flavor.OLLAMA:
        return message
    llama = spec.flavor is Flavor.LLAMACPP
    program = config.node.llamacpp_program if llama else config.node.mlx_program
    hint = install_hint(spec.flavor)
    if hint in message or missing_extra(spec.flavor, program) is None:
        return message
    return f"{message} ({hint} installs it)"
