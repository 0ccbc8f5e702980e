"""Managed Ollama: residency, load and unload outcomes, the load's startup
budget, keep-alive expiry and the memory Ollama reports.

Source: ``reference/infer_lifecycle.rs.txt`` (the Ollama arms of
``start_instance`` and ``stop_instance``): a model already resident belongs
to whoever loaded it; a model we ask to load is ours from the moment we ask
(recorded before the request is sent), so only then do we unload it.

What ``/api/ps`` says (Ollama's docs/api.md "List Running Models": ``size``,
``size_vram``, ``expires_at``; a model is listed from the moment its load
begins, ``server/sched.go``) drives three rules here: a load is given the
kind's startup deadline, extended while Ollama still lists the model, up to
the cap (:func:`load_progress`); a running model Ollama no longer lists was
dropped (its keep_alive ran out, or Ollama evicted it): that is recorded,
its memory released, and it is an exit under the restart policy, so a model
wanted running is loaded again (:func:`listed`); and a model that takes more
memory than was reserved has its reservation corrected (:func:`listed`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from infervisor.adapters.probe import HealthKind, ServerReport
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.durations import seconds
from infervisor.replay.state import Then

from . import observations as o
from . import verbs
from .boot import boot_ollama
from .common import after_exit, record_stop, start_checked, timer_due, unloading
from .decision import Draft, RefusalKind, Rule
from .effects import AbortLoad, CancelTimer, CheckResident, LoadModel, Timer, UnloadModel
from .health import (
    deep_checked,
    judged,
    reconcile,
    set_misses,
    stable_check,
    starting_for,
    watched_miss,
)
from .observations import OllamaListed, OllamaLoadEnded, OllamaResidency, OllamaUnloadEnded
from .residency import rules_with as resident_rules

__all__ = ["RULES", "listed", "load_ended", "load_progress", "residency", "stop", "unload_ended"]

#: What an unhealthy reason adds: this node does not restart Ollama itself.
_NOT_OURS = "infervisor does not start ollama"

S = LifecycleState


def residency(d: Draft, r: OllamaResidency) -> None:
    """Resident already: ready (ours only if we claimed it); else claim, then load."""
    inst = d.inst
    if inst.lifecycle is not S.STARTING:
        return
    tag = d.rules.served_model
    if r.error:
        _load_failed(d, r.error, refused=True)
    elif r.resident:
        if inst.ollama_owned is not True:
            d.emit(ev.ModelClaimed(ours=False))
        owner = (
            "loaded by this node" if inst.ollama_owned else "already resident: not ours to unload"
        )
        d.emit(ev.Ready(detail=f"model {tag} {owner}", at=d.now))
    else:
        if inst.ollama_owned is not True:
            d.emit(ev.ModelClaimed(ours=True))
        d.do(LoadModel())


def load_ended(d: Draft, e: OllamaLoadEnded) -> None:
    """A load that ended: ready, or an exit the restart policy handles."""
    if d.inst.lifecycle is not S.STARTING:
        return
    if e.ok:
        d.emit(ev.Ready(detail=f"model {d.rules.served_model} loaded by this node", at=d.now))
        return
    _load_failed(d, e.error, refused=e.refused)


def load_progress(d: Draft, report: ServerReport, starting_for_s: float) -> None:
    """A load in flight, seen by a probe ``starting_for_s`` seconds after the start
    was recorded: within the kind's ``startup_deadline_s`` it may take its time;
    after that only while Ollama still lists the model (its load in progress),
    up to ``startup_cap_s``. Past either, the load is given up (aborted: Ollama
    cancels a load whose client went away) and is an exit under the restart
    policy. A kind without a startup allowance (cap 0) leaves the load its own
    timeout (``managed_ollama.DEFAULT_LOAD_TIMEOUT_S``); a probe that got no
    ``/api/ps`` list decides nothing."""
    inst, sup = d.inst, d.rules.supervision
    if inst.lifecycle is not S.STARTING or inst.ollama_owned is not True:
        return
    if sup.startup_cap_s <= 0 or report.running is None or starting_for_s <= sup.startup_deadline_s:
        return
    still = report.running_model(d.rules.served_model or "") is not None
    if still and starting_for_s <= sup.startup_cap_s:
        return  # Ollama still reports the load: the deadline extends, up to the cap
    if still:
        cap = seconds(sup.startup_cap_s)
        why = f"not loaded within {cap} (the startup cap; the load was given up)"
    else:
        why = (
            f"Ollama no longer reports the load after {seconds(starting_for_s)} "
            f"(startup deadline {seconds(sup.startup_deadline_s)}; the load was given up)"
        )
    d.do(AbortLoad())
    _load_failed(d, why, refused=False)


def listed(d: Draft, x: OllamaListed) -> None:
    """A running model Ollama dropped is an exit (memory released); one that takes
    more than was reserved has its reservation corrected."""
    inst = d.inst
    if inst.lifecycle not in (S.RUNNING, S.UNHEALTHY):
        return
    if not x.listed:
        if inst.desired is not Desired.RUNNING:
            return
        expires = d.tracking.ollama_expires_at_ns
        expired = expires is None or d.now.wall_ns >= expires
        d.emit(ev.ModelDropped(expired=expired, expires_at_ns=expires))
        if inst.reserved_bytes:
            d.emit(ev.MemoryReleased(bytes=inst.reserved_bytes))
        why = "its keep_alive ran out" if expired else "before its keep_alive ran out"
        tag = d.rules.served_model
        reason = f"ollama dropped model {tag} ({why}); it is loaded again under the restart policy"
        d.emit(ev.Exited(pid=None, exit_code=None, signal=None, reason=reason))
        d.track(msgspec.structs.replace(d.tracking, ollama_expires_at_ns=None))
        after_exit(d)
        return
    d.track(msgspec.structs.replace(d.tracking, ollama_expires_at_ns=x.expires_at_ns))
    needed = max(x.size_bytes, x.size_vram_bytes) + d.rules.reserve_overhead_bytes
    if inst.reserved_bytes and needed > inst.reserved_bytes:
        d.emit(
            ev.MemoryCorrected(
                reserved_bytes=needed, size_bytes=x.size_bytes, size_vram_bytes=x.size_vram_bytes
            )
        )


def _load_failed(d: Draft, error: str, *, refused: bool) -> None:
    if refused and d.inst.ollama_owned:
        d.emit(ev.ModelClaimed(ours=False))  # Ollama refused: it holds nothing of ours
    d.emit(ev.Exited(pid=None, exit_code=None, signal=None, reason=f"load failed: {error}"))
    after_exit(d)


def unload_ended(d: Draft, u: OllamaUnloadEnded) -> None:
    """Memory counts as released only once Ollama no longer lists the model.

    A failed unload is recorded (``instance.unload_failed``): the model stays
    this node's and reserved, but nothing is in flight any more, so a start
    proceeds (and finds it resident) and another stop asks Ollama again."""
    inst = d.inst
    if inst.lifecycle not in (S.STOPPED, S.RESTING):  # resting: evicted or expired
        return
    if u.ok:
        if inst.reserved_bytes:
            d.emit(ev.MemoryReleased(bytes=inst.reserved_bytes))
        if inst.ollama_owned:
            d.emit(ev.ModelClaimed(ours=False))
    elif inst.then != Then.UNLOAD:  # an unloaded instance is forgotten all the same
        if unloading(inst):
            d.emit(ev.UnloadFailed(error=u.error or "no reason given"))
        d.refuse(RefusalKind.FAILED, f"unload failed: {u.error}")
    after_exit(d)


# ---------------------------------------------------------------- verbs
def _holds(d: Draft) -> bool:
    """A model loading or loaded, or one of ours Ollama may still hold."""
    inst = d.inst
    return inst.lifecycle in verbs.UP or (inst.ollama_owned is True and inst.reserved_bytes > 0)


def stop(d: Draft, by: str, grace_s: float, reason: str, then: Then) -> None:
    """Abort a load in flight; unload only what this node loaded (memory is
    released once Ollama no longer lists it); release the reservation of a
    model that was somebody else's."""
    was_starting = d.inst.lifecycle is S.STARTING
    if record_stop(d, by, grace_s, reason, then=then, holds_something=_holds(d)) is None:
        return
    if was_starting:
        d.do(AbortLoad())
    inst = d.inst
    if inst.ollama_owned is True:
        d.do(UnloadModel())
        return
    if inst.reserved_bytes:
        d.emit(ev.MemoryReleased(bytes=inst.reserved_bytes))
    after_exit(d)


def stop_verb(d: Draft, v: o.StopVerb) -> None:
    """Stop: abort a load, unload a model of ours (never one that was resident already)."""
    stop(d, v.by, v.grace_s, v.reason, Then.NOTHING)


def restart_verb(d: Draft, v: o.RestartVerb) -> None:
    """Stop (unload) when anything is loaded, then load again: one decision; restarts coalesce."""
    verbs.restart(d, v, holds_something=_holds(d), stop=stop)


def unload_verb(d: Draft, v: o.UnloadVerb) -> None:
    """Unload a model of ours, then forget the instance; one not loaded is forgotten at once."""
    if _holds(d):
        stop(d, v.by, v.grace_s, "unload", Then.UNLOAD)
        return
    d.do(CancelTimer(name=Timer.RESTART), CancelTimer(name=Timer.KILL))
    d.emit(ev.Unloaded(by=v.by))


def lease_lapsed(d: Draft, lease: o.LeaseLapsed) -> None:
    """Stop (unload) a continuous instance the lapsed controller placed; it stays stopped."""
    verbs.lease_lapsed(d, lease, stop)


def checked(d: Draft, c: o.StartChecked) -> None:
    """A start's checks came back: start by asking whether the model is resident."""
    start_checked(d, c, token="", launch=CheckResident())


# ---------------------------------------------------------------- health
def probe_result(d: Draft, p: o.ProbeResult) -> None:
    """Ollama answers: a load in flight is given its startup allowance; an answer
    clears the misses, recovers an unhealthy model (when its deep checks give a
    token) and clears the restart budget once up long enough; misses make a
    running model unhealthy (never restarted by this node)."""
    if not judged(d, p):
        return
    inst, health = d.inst, p.report.health
    if health.kind is not HealthKind.UP:
        watched_miss(d, health, _NOT_OURS)
        return
    if inst.lifecycle is S.STARTING:
        load_progress(d, p.report, starting_for(d))
        if d.inst.lifecycle is not S.STARTING:
            return
    set_misses(d, 0)
    if inst.lifecycle is S.UNHEALTHY and d.tracking.deep_misses == 0:
        d.emit(ev.Recovered(detail="ollama answers again"))
    else:
        stable_check(d)


def _unhealthy(d: Draft, misses: int, reason: str) -> None:
    d.emit(ev.Unhealthy(misses=misses, reason=f"{reason}; {_NOT_OURS}"))


def deep_result(d: Draft, c: o.DeepChecked) -> None:
    """A failed deep check counts like a miss: ``miss_limit`` in a row make the
    model unhealthy (it is not restarted); a token clears them and recovers it."""
    deep_checked(d, c, _unhealthy)


def tick(d: Draft, _: o.Tick) -> None:
    """Reconcile toward the desired state (load again after an exit or a refusal)."""
    reconcile(d)


#: Every observation of a managed Ollama model and the rule that decides it,
#: in the order of a model's life: its start, its load, its health, its stop.
RULES: dict[type[Any], Rule] = {
    o.StartVerb: verbs.start_verb,
    o.StartChecked: checked,
    o.OllamaResidency: residency,
    o.OllamaLoadEnded: load_ended,
    o.ProbeResult: probe_result,
    o.OllamaListed: listed,
    o.DeepChecked: deep_result,
    o.Tick: tick,
    o.TimerDue: timer_due,
    o.StopVerb: stop_verb,
    o.OllamaUnloadEnded: unload_ended,
    o.RestartVerb: restart_verb,
    o.UnloadVerb: unload_verb,
    o.PlacementVerb: verbs.placement,
    o.LeaseLapsed: lease_lapsed,
    o.BootSeen: boot_ollama,
    **resident_rules(stop, tick),
}
