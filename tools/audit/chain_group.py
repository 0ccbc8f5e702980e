"""``infervisor chain``: the group of the auditor's commands on the chain file."""

from __future__ import annotations

import click

from ..clikit.command import Group
from .chain_bundle import export, verify_bundle_cmd
from .chain_files import backup, checkpoint, rotate_key
from .chain_proofs import consistency, prove
from .chain_verify import verify

__all__ = ["chain"]


@click.group(cls=Group)
def chain() -> None:
    """Audit the event chain."""


for _command in (verify, prove, consistency, checkpoint, backup, rotate_key, export):
    chain.add_command(_command)
chain.add_command(verify_bundle_cmd)
