"""httpx, imported when a request is first made.

A command that finds no node's socket (``status`` of a stopped node) never
loads it (a third of such a command's start-up: issue 22). Modules use it as::

    if TYPE_CHECKING:
        import httpx
    else:
        from .lazy_httpx import httpx
"""

from __future__ import annotations

from typing import Any

__all__ = ["httpx"]


class _Httpx:
    """Stands for the httpx module: its attributes are httpx's, imported at the first use."""

    def __getattr__(self, name: str) -> Any:
        import httpx  # noqa: PLC0415 - see the module's docstring

        return getattr(httpx, name)


httpx = _Httpx()
