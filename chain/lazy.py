"""A package whose public names load when first asked for (PEP 562).

A command that needs one small module of a package (``infervisor status``
needs one record type of `infervisor.chain`, one view of `infervisor.replay`)
should not load the package's every module with it: start-up time is what an
operator waits for on each command (tests/test_cli_imports.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``.

    Args:
        package: the package's ``__name__``.
        homes: each public name -> the submodule (relative, no dot) that defines it.
        namespace: the package's ``globals()``; a loaded name is cached there, so
            it is looked up once.

    Raises:
        AttributeError: (from ``__getattr__``) for a name not in ``homes``.
    """

    def get(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home}", package), name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted({*namespace, *homes})

    return get, names
