"""A process's start-up without Python's cyclic garbage collector.

Importing is most of what an ``infervisor`` process does before its work
(bench/cli_startup.py): about 100,000 objects (classes, functions,
dataclasses and Structs being made) that all live until the process ends.
The collector, triggered every 700 allocations, went over them again and
again: 140 collections, 70 ms of the 460 ms of CPU a node spent importing
and building its API (``gc.callbacks``, 2026-12-03), for about a thousand
objects of garbage (functions, cells and tuples left by class decorators).

So a command starts with the collector off (:func:`begin`, the console entry
point) and turns it back on once it has loaded what it runs on
(:func:`done`: the command's module for a client; for ``infervisor run``,
the node open and its API serving), first moving every object alive by then
to the permanent generation (``gc.freeze``,
docs.python.org/3/library/gc.html), so that no later collection, nor the
one at exit, goes over them again: a node's CPU from its start to its exit
fell by a quarter. That start-up garbage is frozen with them and never freed
(about 900 objects in a node, none with a finalizer: no file or socket);
anything that becomes garbage later is collected as usual.
"""

from __future__ import annotations

import gc

__all__ = ["begin", "done"]


def begin() -> None:
    """The process starts: no cyclic collection until :func:`done`. Only a process
    of its own calls it (the console entry point), never a command run in another
    program's process (click's CliRunner in the tests)."""
    gc.disable()


def done() -> None:
    """The start-up is over: what it made is frozen (never collected again) and the
    collector runs again. Nothing is done where the collector is on: a process
    that did not :func:`begin` (a command run in a test's process), or a second call."""
    if gc.isenabled():
        return
    gc.freeze()
    gc.enable()
