"""``infervisor chain``: the group of the auditor's commands on the chain file.

Each command is declared in the module that does its work, imported only
when the command runs or ``infervisor chain --help`` lists it (their
checkpoint, proof and bundle libraries are not needed by anything else).
"""

from __future__ import annotations

import click

from ..clikit.command import LazyGroup

__all__ = ["chain"]

#: Each command's name -> where it is declared (a module of this package).
COMMANDS = {
    "verify": ".chain_verify:verify",
    "prove": ".chain_proofs:prove",
    "consistency": ".chain_proofs:consistency",
    "checkpoint": ".chain_files:checkpoint",
    "backup": ".chain_files:backup",
    "rotate-key": ".chain_files:rotate_key",
    "export": ".chain_bundle:export",
    "verify-bundle": ".chain_bundle:verify_bundle_cmd",
    "pull": ".chain_pull:pull_cmd",
}


@click.group(cls=LazyGroup, lazy=COMMANDS, package=__package__)
def chain() -> None:
    """Audit the event chain."""
