"""An operator's ``unload`` of an instance the config lists holds at every later
boot, until the config changes that instance's entry (a newcomer's trial, stop 33:
the boot after the one that finished the unload placed it again, silently).

``infervisor run`` runs as a real process (tests/test_run_resume.py ``runs``) on the
fake llama server; the unload is the real ``infervisor unload`` verb. The rule is
tools/node/placing.py ``place_new`` with actors/core/config_hold.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from test_run_resume import (
    DEADLINE_S,
    NodeRun,
    by_role,
    cli,
    distinct_ports,
    events_of,
    lifecycle,
    put_model,
    runs,  # noqa: F401 - the fixture
    write_config,
)

from infervisor.actors.core.config_hold import Outcome, Recorded, decide_config_entry


def _placed(db: Path, iid: str) -> int:
    return sum(1 for e in events_of(db) if e.kind == "instance.placed" and e.subject == iid)


def _boot_once(start_run: Callable[[Path], NodeRun], config: Path) -> str:
    """Run the node until it is up, stop it; its output."""
    run = start_run(config)
    run.until("the node running", lambda: "Ctrl-C or SIGTERM stops it" in run.output())
    assert run.stop() == 0, run.output()
    return run.output()


def test_an_unloaded_config_instance_stays_unloaded_until_its_entry_changes(
    runs: Callable[[Path], NodeRun],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    fake_llama: str,
) -> None:
    put_model(tmp_path / "data")
    ports = distinct_ports()
    config = write_config(tmp_path, fake_llama, ports=ports)
    db = tmp_path / "data" / "chain.db"
    first = runs(config)
    state = first.until_state(
        db, "chat running", lambda s: lifecycle(s, "chat") == "running", DEADLINE_S
    )
    chat, _ = by_role(state.instances, "chat")
    unloaded = cli("unload", tmp_path / "data", chat)
    assert unloaded.returncode == 0, unloaded.stderr
    assert first.stop() == 0, first.output()

    # Two boots on the same chain and config decide the same: chat stays unloaded.
    for _ in range(2):
        said = _boot_once(runs, config)
        assert f"note: {chat} stays unloaded (unloaded by operator" in said, said
        assert _placed(db, chat) == 1, said

    # A changed entry places it again, saying why.
    write_config(tmp_path, fake_llama, ports=ports, instance_extra="ctx_size = 1024")
    said = _boot_once(runs, config)
    assert f"warning: {chat} was unloaded by operator" in said, said
    assert "the config changed ctx_size since, so it is placed again" in said, said
    assert _placed(db, chat) == 2, said


def test_the_rule_reads_the_chain_and_the_config_alone() -> None:
    """actors/core/config_hold.py: the same record and entry, the same verdict."""
    spec = {"role": "chat", "ctx_size": 512}
    assert decide_config_entry("c", spec, None).outcome is Outcome.PLACE  # never placed
    held = Recorded(spec=spec, unloaded_seq=7, unloaded_by="operator")
    verdict = decide_config_entry("c", spec, held)
    assert verdict.outcome is Outcome.HOLD
    assert verdict.note.startswith("note: c stays unloaded (unloaded by operator at [7])")
    changed = decide_config_entry("c", {**spec, "ctx_size": 1024}, held)
    assert (changed.outcome, changed.changed) == (Outcome.PLACE, ("ctx_size",))
