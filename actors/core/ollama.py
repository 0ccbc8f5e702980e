"""Managed Ollama: residency, load and unload outcomes.

Source: ``reference/infer_lifecycle.rs.txt`` (the Ollama arms of
``start_instance`` and ``stop_instance``): a model already resident belongs
to whoever loaded it; a model we ask to load is ours from the moment we ask
(recorded before the request is sent), so only then do we unload it.
"""

from __future__ import annotations

from infervisor.replay import LifecycleState
from infervisor.replay import events as ev

from .common import after_exit
from .decision import Draft, RefusalKind
from .effects import LoadModel
from .observations import OllamaLoadEnded, OllamaResidency, OllamaUnloadEnded

__all__ = ["load_ended", "residency", "unload_ended"]

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


def _load_failed(d: Draft, error: str, *, refused: bool) -> None:
    if refused and d.inst.ollama_owned:
        d.emit(ev.ModelClaimed(ours=False))  # Ollama refused: it holds nothing of ours
    d.emit(ev.Exited(pid=None, exit_code=None, signal=None, reason=f"load failed: {error}"))
    after_exit(d)


def unload_ended(d: Draft, u: OllamaUnloadEnded) -> None:
    """Memory counts as released only once Ollama no longer lists the model."""
    inst = d.inst
    if inst.lifecycle is not S.STOPPED:
        return
    if u.ok:
        if inst.reserved_bytes:
            d.emit(ev.MemoryReleased(bytes=inst.reserved_bytes))
        if inst.ollama_owned:
            d.emit(ev.ModelClaimed(ours=False))
    elif inst.then != "unload":  # an unloaded instance is forgotten all the same
        d.refuse(RefusalKind.FAILED, f"unload failed: {u.error}")
    after_exit(d)
