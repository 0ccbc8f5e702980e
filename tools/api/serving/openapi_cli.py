"""docs/openapi.json: write or check the control API's OpenAPI document.

``python -m infervisor.tools.api.serving.openapi_cli --write`` regenerates it from the
routes (tools/api/serving/); ``--check`` exits 1 when the checked-in file
differs; with neither, the document goes to standard output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..context import ApiContext
from ..openapi import openapi_document
from .app import build_app

__all__ = ["DOC", "REGENERATE", "document", "main"]

#: The checked-in document.
DOC = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
#: The command that regenerates it.
REGENERATE = "python -m infervisor.tools.api.serving.openapi_cli --write"


def document() -> bytes:
    """The OpenAPI document the node serves (independent of any data directory)."""
    ctx = ApiContext(
        data_dir=Path("/nonexistent"),
        chain_path=Path("/nonexistent/chain.db"),
        node_id="openapi",
        node_uid=0,
    )
    return openapi_document(build_app(ctx))


def main(argv: list[str] | None = None) -> int:
    """Exit 0 (written, or up to date), 1 (``--check``: it differs)."""
    parser = argparse.ArgumentParser(prog="openapi_cli", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when docs/openapi.json differs")
    mode.add_argument("--write", action="store_true", help="rewrite docs/openapi.json")
    parser.add_argument(
        "--path", type=Path, default=DOC, help="the document (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    wanted = document()
    if args.write:
        args.path.write_bytes(wanted)
        return 0
    if args.check:
        current = args.path.read_bytes() if args.path.exists() else b""
        if current != wanted:
            print(f"{args.path} is out of date; regenerate it: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    sys.stdout.buffer.write(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
