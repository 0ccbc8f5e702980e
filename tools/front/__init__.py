"""The node's OpenAI-compatible endpoint (issue 21, docs/front.md): one address
for every instance, routed by ``model``, a client of the node like the control API.

Importing the package loads only its config type (the config loader's, and so
the command line's, import): :class:`~.server.FrontServer` is loaded when asked for.
"""

from __future__ import annotations

from typing import Any

from .settings import FrontConfig

__all__ = ["FrontConfig", "FrontServer"]


def __getattr__(name: str) -> Any:
    if name == "FrontServer":
        from .server import FrontServer  # noqa: PLC0415 - uvicorn and httptools load here

        return FrontServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
