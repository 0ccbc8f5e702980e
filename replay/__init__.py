"""Pure replay: typed events, the lifecycle table, the reducer, restart policy, queries.

No I/O but reading the chain.
"""

from .events import Event, EventDecodeError, InstanceEvent, decode_event, encode_event, kind_of
from .lifecycle import LIVE_STATES, TRANSITIONS, IllegalTransition, LifecycleState
from .policy import Exhausted, Restart, RestartDecision, RestartPolicy, decide_restart
from .queries import ChainRead, TimelineEntry, read_chain, rebuild, timeline, timeline_of
from .reducer import Folder, ReplayError, apply, apply_instance, fold, reason_of
from .state import Desired, ExitRecord, InstanceState, NodeState, ProcessRecord

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
