"""WHERE on the command line: a node's data directory, its config file (.toml) or
its chain file, as the data directory and the chain file it names."""

from __future__ import annotations

from pathlib import Path

from ..clikit.failure import fail

__all__ = ["chain_of", "where"]


def where(arg: Path) -> tuple[Path, Path]:
    """(data_dir, chain file) named by ARG: a data directory, a config file
    (.toml, naming its data_dir) or the chain file itself; exits 2 when ARG
    names nothing or its config does not load."""
    if not arg.exists():
        fail(
            f"WHERE {arg}: no such chain file, data directory or config file (.toml)",
            "bad_path",
        )
    if arg.is_dir():
        return arg, arg / "chain.db"
    if arg.suffix == ".toml":
        # Imported here: the config's types load the node's settings (0.1 s).
        from .config import ConfigError, load_config  # noqa: PLC0415

        try:
            folder = Path(load_config(arg).node.data_dir)
        except ConfigError as e:
            fail(str(e), "bad_config")
        return folder, folder / "chain.db"
    return arg.parent, arg


def chain_of(arg: Path) -> Path:
    """The chain file ARG names; exits 2 when there is none."""
    db = where(arg)[1]
    if not db.is_file():
        fail(
            f"WHERE {arg}: no such chain file {db} (a node's data directory holds chain.db)",
            "no_chain",
        )
    return db
