"""Event sources (replay/callers.py): built and parsed, every form ever stored.

Issue 19: a request naming a controller records the controller's name, then
the credential it came with; chains written before still parse.
"""

from __future__ import annotations

import pytest

from infervisor.replay.callers import (
    Source,
    controller_source,
    lease_source,
    parse_source,
    token_credential,
)
from infervisor.tools.audit.events import _source_keys

PARSED = [
    ("controller:ctl1 (token fleet-ctl)", Source(role="controller", controller="ctl1",
                                                 credential="token fleet-ctl")),
    ("controller:ctl1 (uid=0(root))", Source(role="controller", controller="ctl1",
                                             credential="uid=0(root)")),
    ("lease:ctl1", Source(role="lease", controller="ctl1")),
    ("operator:token=ops (scope operate)", Source(role="operator",
                                                  credential="token=ops (scope operate)")),
    ("operator:uid=1000(alice)", Source(role="operator", credential="uid=1000(alice)")),
    # chains written before issue 19, and before token scopes
    ("controller:token=ci (scope control)", Source(role="controller",
                                                   credential="token=ci (scope control)")),
    ("controller:token=ci", Source(role="controller", credential="token=ci")),
    ("controller:uid=0(root)", Source(role="controller", credential="uid=0(root)")),
    ("lease", Source(role="lease")),
    ("controller", Source(role="controller")),
    ("supervisor", Source(role="supervisor")),
]  # fmt: skip


@pytest.mark.parametrize(("source", "parsed"), PARSED, ids=[s for s, _ in PARSED])
def test_every_source_parses(source: str, parsed: Source) -> None:
    assert parse_source(source) == parsed


def test_a_controller_source_round_trips() -> None:
    over_tcp = controller_source("ctl1", token_credential("fleet-ctl"))
    assert over_tcp == "controller:ctl1 (token fleet-ctl)"
    over_socket = controller_source("ctl1", "uid=0(root)")
    assert over_socket == "controller:ctl1 (uid=0(root))"
    for source in (over_tcp, over_socket):
        assert parse_source(source).controller == "ctl1"
    assert lease_source("ctl1") == "lease:ctl1"


@pytest.mark.parametrize("name", ["", "ctl 1", "a=b", "-ctl", "x" * 65, "ctl\n"])
def test_a_controller_source_refuses_what_is_not_a_name(name: str) -> None:
    with pytest.raises(ValueError, match="plain token"):
        controller_source(name, "uid=0(root)")


def test_events_source_filter_names_a_controller_whatever_its_credential() -> None:
    assert "controller:ctl1" in _source_keys("controller:ctl1 (token fleet-ctl)")
    assert "controller:ctl1" in _source_keys("controller:ctl1 (uid=0(root))")
    assert "lease:ctl1" in _source_keys("lease:ctl1")
    assert _source_keys("operator:uid=0(root)") == ("operator:uid=0(root)", "operator")
