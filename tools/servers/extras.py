"""Optional extras: which one a flavor needs, and a message naming it when missing.

``llamacpp`` (``pip install 'infervisor[llamacpp]'``): the tiny-model generator
(``gguf``, ``numpy``) and the llama.cpp server the launcher embeds
(``xllamacpp``, unless ``llama-server`` is on PATH). ``mlx``
(``pip install 'infervisor[mlx]'``): ``mlx_lm`` and its ``mlx_lm.server``.
"""

from __future__ import annotations

import importlib.util
import shutil

from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.launch import resolve_program
from infervisor.adapters.spec import Flavor

__all__ = ["EXTRAS", "install_hint", "missing_extra", "missing_modules"]

#: The extra each launched flavor needs, and the modules it brings.
EXTRAS: dict[Flavor, tuple[str, tuple[str, ...]]] = {
    Flavor.LLAMACPP: ("llamacpp", ("gguf", "numpy")),
    Flavor.MLX_LM: ("mlx", ("mlx_lm",)),
}


def install_hint(flavor: Flavor) -> str:
    """``pip install 'infervisor[<extra>]'`` for the flavor's extra ("" when none)."""
    extra = EXTRAS.get(flavor)
    return f"pip install 'infervisor[{extra[0]}]'" if extra else ""


def missing_extra(flavor: Flavor, program: str) -> str | None:
    """What is missing to launch ``flavor`` with ``program``, naming the extra to
    install; None when nothing is."""
    extra = EXTRAS.get(flavor)
    if extra is None:
        return None
    absent = missing_modules(flavor)
    if flavor is Flavor.LLAMACPP and shutil.which("llama-server") is None:
        absent += [] if _importable("xllamacpp") else ["xllamacpp (or llama-server on PATH)"]
    try:
        resolve_program(program)
    except AdmissionRefused:
        absent.append(f"the server program {program}")
    if not absent:
        return None
    return (
        f"{flavor.value} needs the {extra[0]} extra: {install_hint(flavor)} "
        f"(missing: {', '.join(absent)})"
    )


def missing_modules(flavor: Flavor) -> list[str]:
    """The modules of the flavor's extra that cannot be imported."""
    extra = EXTRAS.get(flavor)
    return [m for m in (extra[1] if extra else ()) if not _importable(m)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
