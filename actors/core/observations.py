"""What the decision core is told: verbs, probe results, exits, timers, snapshots, boot.

Every observation is a frozen record; the executor (the instance actor)
gathers whatever I/O an observation needs (a probe, a port check, a ledger
reservation, the process table at boot) before it hands it to the core, so
the core itself never does any.
"""

from __future__ import annotations

import msgspec

from infervisor.adapters.probe import ServerReport
from infervisor.replay import residency_events as rev

from .effects import Timer

__all__ = [
    "AnswersChecked",
    "BootSeen",
    "DeepChecked",
    "GroupGone",
    "LeaseLapsed",
    "ListenersSeen",
    "Observation",
    "OllamaListed",
    "OllamaLoadEnded",
    "OllamaResidency",
    "OllamaUnloadEnded",
    "PlacementVerb",
    "ProbeResult",
    "ProcessAlive",
    "ProcessExited",
    "ProcessGone",
    "ProcessNone",
    "RestartVerb",
    "SpawnFailed",
    "SpawnSucceeded",
    "StartChecked",
    "StartVerb",
    "StopVerb",
    "Tick",
    "TimerDue",
    "UnloadVerb",
]


class _Obs(msgspec.Struct, frozen=True, kw_only=True):
    pass


# ---------------------------------------------------------------- verbs
class StartVerb(_Obs, frozen=True):
    """Start the server; ``by="operator"`` resets the restart budget. ``room``: the
    node makes room when it does not fit (a memory refusal is answered, not
    recorded: actors/node_residency.py plans the evictions)."""

    by: str
    room: bool = False


class StopVerb(_Obs, frozen=True):
    """Stop the server: SIGTERM, SIGKILL after ``grace_s`` seconds."""

    by: str
    grace_s: float
    reason: str = ""


class RestartVerb(_Obs, frozen=True):
    """Stop, then start again, as one decision (concurrent restarts coalesce)."""

    by: str
    grace_s: float
    room: bool = False  #: as StartVerb's


class UnloadVerb(_Obs, frozen=True):
    """Stop the server (``grace_s``) and forget the instance."""

    by: str
    grace_s: float


class PlacementVerb(_Obs, frozen=True):
    """The instance was placed again with this generation; ``by`` is the source."""

    placed_by: str
    generation: int
    by: str = "controller"


# ---------------------------------------------------------------- residency (issue 21)
class DemandVerb(_Obs, frozen=True):
    """A request (``request``: its id, or ``verb``) asks for the instance by ``model``:
    start it when it rests (actors/core/residency.py)."""

    request: str
    model: str
    by: str


class EvictVerb(_Obs, frozen=True):
    """The node evicts this instance for ``for_instance`` (its plan's numbers, bytes):
    record ``residency.evicted`` with a stop to rest, unless it turned busy or
    is no longer evictable."""

    by: str
    for_instance: str
    needed_bytes: int
    freed_bytes: int
    budget_bytes: int
    in_use_bytes: int
    candidates: tuple[rev.Candidate, ...]
    grace_s: float
    #: Why ``for_instance`` starts (a request, a verb, a restart after an exit, a boot).
    cause: str = ""


class RoomRefused(_Obs, frozen=True):
    """The node found nothing to evict for this instance's start: record
    ``residency.refused`` with the ledger (bytes) and answer ``no_room``."""

    by: str
    needed_bytes: int
    budget_bytes: int
    in_use_bytes: int
    held: dict[str, int]
    candidates: tuple[rev.Candidate, ...]
    #: How long the start waited for busy or loading instances, seconds.
    waited_s: float = 0.0
    #: A start the node decided itself (retried at each reconcile tick): an
    #: identical refusal is recorded once, however long apart (as a start's).
    node: bool = False


class StartAgain(_Obs, frozen=True):
    """The node made room (or found none to make) for a start it decided itself
    (``by``: the supervisor or the boot, as the start that asked): decide that
    start again, as the reconcile tick would. Not ``record``: a memory refusal
    is answered to the node (it plans again); ``record``: recorded
    (``instance.start_refused``, once per cause), the node having nothing to evict."""

    by: str
    record: bool = False


class RoomPlanned(_Obs, frozen=True):
    """The node evicts others for this instance's start: record the start as
    demanded first (``residency.demanded``: a boot resumes it), unless it is up
    or already demanded. ``verb``: an operator's or controller's start (it may
    start a stopped instance); otherwise a request's (refused ``stopped``).
    Refused, nothing recorded, while the start would be held back (an unload
    in flight, stopped for exposure), as the demand is."""

    request: str
    model: str
    by: str
    verb: bool


class RequestBegan(_Obs, frozen=True):
    """A request routed to the instance began (the front, or a server's counters)."""

    #: Requests that began together (the front tells those of one event-loop turn at once).
    count: int = 1


class RequestEnded(_Obs, frozen=True):
    """A request routed to the instance ended (answered, failed or cancelled)."""

    #: Requests that ended together.
    count: int = 1


class ServerActivity(_Obs, frozen=True):
    """The server's own counters (llama-server ``/slots`` or ``/metrics``, Ollama
    ``/api/ps``): ``active`` requests in progress now, as it reports them
    (clients that talk to it directly count too)."""

    active: int


# ---------------------------------------------------------------- start checks
class StartChecked(_Obs, frozen=True):
    """What the executor found before a start: the address, the model and the memory.

    Attributes:
        by: who asked for the start.
        reset_budget: an operator start clears the restart budget.
        attempt: the restart attempt this start is (0: not a restart).
        verb: a caller waits for the answer (a refusal is raised to it).
        taken: ``host:port`` when something else already listens there.
        reserved_bytes: what the ledger set aside (tentatively) for it.
        memory_refusal: why the memory does not fit (with the numbers).
        model_refusal: why the weights must not be launched (a size or
            digest mismatch with the expected and found values, a GGUF that
            does not parse, weights gone); checked before every launch.
        precheck: the weights alone were checked, before a restart stops the
            server it would replace.
    """

    by: str
    reset_budget: bool
    attempt: int
    verb: bool
    taken: str | None = None
    reserved_bytes: int = 0
    memory_refusal: str | None = None
    model_refusal: str | None = None
    precheck: bool = False
    #: A demand's start: a memory refusal is answered (the node may evict) not recorded.
    demand: bool = False
    #: A request's start (its id and the model asked for; "" for any other start):
    #: ``residency.demanded`` is recorded with the start when none is pending.
    request: str = ""
    model: str = ""
    #: The node planned room for it already: a memory refusal is recorded, not asked again.
    planned: bool = False


class AnswersChecked(_Obs, frozen=True):
    """Adopted start: None when the server answers, else why it does not.

    ``loading``: it answered that it is still loading its model (llama.cpp's
    503 "Loading model"), so it is starting, not serving yet."""

    by: str
    why_not: str | None
    loading: bool = False


class SpawnSucceeded(_Obs, frozen=True):
    """The launch produced a server process (identity as recorded in ``spawned``)."""

    token: str
    pid: int
    pgid: int
    start_time: float
    boot_id: str
    argv: list[str]


class SpawnFailed(_Obs, frozen=True):
    """The launch could not run the program (names it and why)."""

    token: str
    reason: str


# ---------------------------------------------------------------- the process
class ProcessExited(_Obs, frozen=True):
    """The server's leader exited (seen by its waiter); its group may linger."""

    pid: int


class GroupGone(_Obs, frozen=True):
    """Nothing of the server's process group is left. ``note``: what had to be
    forced (or could not be), empty when nothing."""

    pid: int
    exit_code: int | None
    signal: int | None
    output_tail: str = ""
    note: str = ""
    oom_killed: bool = False
    memory_max_bytes: int | None = None


class ProbeResult(_Obs, frozen=True):
    """A health probe's report. ``token`` names the process it was for (its pid;
    0 when there is none); ``failure`` is a line of the server's output that
    says it will never serve."""

    token: int
    report: ServerReport
    failure: str | None = None


class DeepChecked(_Obs, frozen=True):
    """A scheduled deep health check ended (one real token asked for). ``token``
    names the process it was for (as :class:`ProbeResult`); ``error`` is None
    when a token came back, else why not (the server's answer)."""

    token: int
    error: str | None = None


class ListenersSeen(_Obs, frozen=True):
    """Addresses beyond loopback on the instance's port that belong to its own
    process group or tracked descendants (one socket-table snapshot per tick)."""

    owned_beyond: tuple[str, ...]


class TimerDue(_Obs, frozen=True):
    """A timer the core armed fell due: ``restart`` or ``kill``."""

    name: Timer


class Tick(_Obs, frozen=True):
    """The reconcile tick: compare desired and actual state."""


class LeaseLapsed(_Obs, frozen=True):
    """``controller`` has not been heard for ``silent_s`` seconds (longer than the
    lease): what it placed stops."""

    silent_s: float
    controller: str


# ---------------------------------------------------------------- Ollama
class OllamaResidency(_Obs, frozen=True):
    """Whether Ollama already lists the model (asked before loading it)."""

    resident: bool
    error: str = ""


class OllamaLoadEnded(_Obs, frozen=True):
    """The load request ended: ``ok``, or the error; ``refused`` when Ollama
    answered with an error (it holds nothing of ours)."""

    ok: bool
    error: str = ""
    refused: bool = False


class OllamaListed(_Obs, frozen=True):
    """What Ollama's ``/api/ps`` said of the model on a probe that got a model list
    (docs/api.md "List Running Models"). ``listed``: it is in memory (or being
    loaded); then ``size_bytes`` and ``size_vram_bytes`` are the memory it takes
    (bytes) and ``expires_at_ns`` when Ollama will drop it unless it is used
    (ns since the epoch, UTC; None: never, or not reported)."""

    listed: bool
    size_bytes: int = 0
    size_vram_bytes: int = 0
    expires_at_ns: int | None = None


class OllamaUnloadEnded(_Obs, frozen=True):
    """The unload ended: ``ok`` once Ollama no longer lists the model."""

    ok: bool
    error: str = ""


# ---------------------------------------------------------------- boot
class ProcessAlive(msgspec.Struct, frozen=True, kw_only=True, tag="alive"):
    """The recorded (or launched) process still runs and is watched again.
    ``recovered``: it was found from its launch token, never recorded spawned."""

    pid: int
    pgid: int
    start_time: float
    boot_id: str
    recovered: bool = False


class ProcessGone(msgspec.Struct, frozen=True, kw_only=True, tag="gone"):
    """The process is gone. Its status when the shim recorded one."""

    pid: int | None
    exit_code: int | None
    signal: int | None
    reason: str


class ProcessNone(msgspec.Struct, frozen=True, kw_only=True, tag="none"):
    """No process was recorded and no launch was in flight."""


class BootSeen(_Obs, frozen=True):
    """The node (re)started: what became of the instance's process; its strays.

    ``strays``: live processes in the instance's server cgroup that no record
    claims (the kernel's membership; empty without cgroups), in ``cgroup``;
    ``held``: not to be started again (a drained node's controller instance)."""

    process: ProcessAlive | ProcessGone | ProcessNone
    strays: list[int] = msgspec.field(default_factory=list)
    cgroup: str = ""
    #: The node is drained and a controller placed it: nothing of it is started
    #: again (the drain's stop follows, actors/core/cordon.py).
    held: bool = False


Observation = (
    StartVerb
    | StopVerb
    | RestartVerb
    | UnloadVerb
    | PlacementVerb
    | StartChecked
    | AnswersChecked
    | SpawnSucceeded
    | SpawnFailed
    | ProcessExited
    | GroupGone
    | ProbeResult
    | DeepChecked
    | ListenersSeen
    | TimerDue
    | Tick
    | LeaseLapsed
    | OllamaResidency
    | OllamaLoadEnded
    | OllamaListed
    | OllamaUnloadEnded
    | BootSeen
    | DemandVerb
    | EvictVerb
    | RoomRefused
    | RoomPlanned
    | StartAgain
    | RequestBegan
    | RequestEnded
    | ServerActivity
)
