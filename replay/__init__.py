"""Pure replay: typed events, the lifecycle table, the reducer, restart policy, queries.

No I/O but reading the chain.

The names below are loaded when first asked for (PEP 562): a command that needs
one record (``infervisor status`` needs `replay.views`) does not load the
events, the reducer and the chain reader with it (tests/test_cli_imports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infervisor.chain.lazy import lazy_names

if TYPE_CHECKING:
    from .events import Event, EventDecodeError, InstanceEvent, decode_event, encode_event, kind_of
    from .lifecycle import LIVE_STATES, TRANSITIONS, IllegalTransition, LifecycleState
    from .policy import Exhausted, Restart, RestartDecision, RestartPolicy, decide_restart
    from .queries import ChainRead, TimelineEntry, read_chain, rebuild, timeline, timeline_of
    from .reducer import Folder, ReplayError, apply, apply_instance, fold, reason_of
    from .state import Desired, ExitRecord, InstanceState, NodeState, ProcessRecord

#: Where each public name lives (the submodule that defines or re-exports it).
_HOME: dict[str, str] = {
    **dict.fromkeys(
        ("Event", "EventDecodeError", "InstanceEvent", "decode_event", "encode_event", "kind_of"),
        "events",
    ),
    **dict.fromkeys(
        ("LIVE_STATES", "TRANSITIONS", "IllegalTransition", "LifecycleState"), "lifecycle"
    ),
    **dict.fromkeys(
        ("Exhausted", "Restart", "RestartDecision", "RestartPolicy", "decide_restart"), "policy"
    ),
    **dict.fromkeys(
        ("ChainRead", "TimelineEntry", "read_chain", "rebuild", "timeline", "timeline_of"),
        "queries",
    ),
    **dict.fromkeys(
        ("Folder", "ReplayError", "apply", "apply_instance", "fold", "reason_of"), "reducer"
    ),
    **dict.fromkeys(
        ("Desired", "ExitRecord", "InstanceState", "NodeState", "ProcessRecord"), "state"
    ),
}


__getattr__, __dir__ = lazy_names(__name__, _HOME, globals())


__all__ = [
    "LIVE_STATES",
    "TRANSITIONS",
    "ChainRead",
    "Desired",
    "Event",
    "EventDecodeError",
    "Exhausted",
    "ExitRecord",
    "Folder",
    "IllegalTransition",
    "InstanceEvent",
    "InstanceState",
    "LifecycleState",
    "NodeState",
    "ProcessRecord",
    "ReplayError",
    "Restart",
    "RestartDecision",
    "RestartPolicy",
    "TimelineEntry",
    "apply",
    "apply_instance",
    "decide_restart",
    "decode_event",
    "encode_event",
    "fold",
    "kind_of",
    "read_chain",
    "reason_of",
    "rebuild",
    "timeline",
    "timeline_of",
]
