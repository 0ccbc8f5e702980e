"""Test harness: ``adapters.ports.free_port`` hands a port out once per test process.

The kernel may offer the same free port to two ``free_port()`` calls in a row,
and a test that places two instances then sees them collide ("already used by
another instance"). conftest.py imports this first, so every test module that
imports ``free_port`` gets the patched one.
"""

from __future__ import annotations

import infervisor.adapters.ports as ports

_of_the_kernel = ports.free_port
_handed_out: set[int] = set()


def free_port_once(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, not handed out before in this process."""
    port = _of_the_kernel(host)
    for _ in range(64):
        if port not in _handed_out:
            break
        port = _of_the_kernel(host)
    _handed_out.add(port)
    return port


ports.free_port = free_port_once
