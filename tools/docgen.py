"""Tables in docs/ generated from the code, so the documents cannot drift.

``python -m infervisor.tools.docgen`` rewrites the generated sections of
``docs/lifecycle.md``, ``docs/status-map.md``, ``docs/cli.md`` (the
command line's commands, error codes and JSON schemas) and ``docs/api.md``
(the scope of each route); ``--check`` only
compares (exit 1 naming the stale ones); a test checks they match.
A generated section sits between ``<!-- generated: NAME -->`` and
``<!-- end generated -->``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import click

from infervisor.actors.core.decide import RULES
from infervisor.actors.core.wake import (
    RECONCILE_MEANINGS,
    RECONCILE_RULES,
    WAKE_MEANINGS,
    WAKE_RULES,
)
from infervisor.adapters.status import MAP_REPORT_CASES
from infervisor.replay.lifecycle import LIVE_STATES, TRANSITIONS

__all__ = [
    "GENERATORS",
    "first_paragraph",
    "refresh",
    "render_api_scopes",
    "render_cli_codes",
    "render_cli_commands",
    "render_cli_schemas",
    "render_reconcile_table",
    "render_rule_table",
    "render_status_table",
    "render_transition_table",
    "render_wake_table",
]


def render_transition_table() -> str:
    """Markdown: every lifecycle state, whether it is live, and where it may go."""
    rows = ["| from | live | may go to |", "|---|---|---|"]
    for state, targets in TRANSITIONS.items():
        live = "yes" if state in LIVE_STATES else ""
        rows.append(f"| `{state}` | {live} | {', '.join(f'`{t}`' for t in sorted(targets))} |")
    return "\n".join(rows)


def render_status_table() -> str:
    """Markdown: every case of ``map_report`` in the order it is tried."""
    rows = ["| # | when | state | detail | phase |", "|---|---|---|---|---|"]
    for i, case in enumerate(MAP_REPORT_CASES, 1):
        detail = f"`{case.detail}`" if case.detail else "—"
        row = f"| {i} | {case.description} | `{case.state}` | {detail} | `{case.phase}` |"
        rows.append(row)
    return "\n".join(rows)


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph, whole, on one line (sentences are never cut)."""
    paragraph = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split()).replace("|", "\\|")


def render_rule_table() -> str:
    """Markdown: per mode, every observation it takes and the rule that decides it."""
    parts: list[str] = []
    for mode, table in RULES.items():
        rows = [f"**{mode}**", "", "| observation | rule | what it decides |", "|---|---|---|"]
        for obs, rule in table.items():
            where = f"`{rule.__module__.rsplit('.', 1)[-1]}.{rule.__name__}`"
            doc, what = first_paragraph(obs.__doc__), first_paragraph(rule.__doc__)
            rows.append(f"| `{obs.__name__}`: {doc} | {where} | {what} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def render_wake_table() -> str:
    """Markdown: the probe engine's wake rule, reason by reason, first match wins."""
    rows = ["| reason | holds when |", "|---|---|"]
    rows += [f"| `{reason}` | {WAKE_MEANINGS[reason]} |" for reason, _ in WAKE_RULES]
    return "\n".join(rows)


def render_reconcile_table() -> str:
    """Markdown: why a reconcile tick wakes an instance's actor, first match wins."""
    rows = ["| reason | holds when |", "|---|---|"]
    rows += [f"| `{reason}` | {RECONCILE_MEANINGS[reason]} |" for reason, _ in RECONCILE_RULES]
    return "\n".join(rows)


def render_cli_codes() -> str:
    """Markdown: every error code of the command line and the exit status it gives."""
    from .api.exit_codes import CODES  # noqa: PLC0415 - the CLI's modules load only when asked

    rows = ["| code | exit |", "|---|---|"]
    rows += [f"| `{code}` | {int(status)} |" for code, status in CODES.items()]
    return "\n".join(rows)


def render_cli_schemas() -> str:
    """Markdown: each JSON Schema of the command line's objects, by name."""
    from .clikit.schemas import SCHEMAS  # noqa: PLC0415

    return "\n\n".join(
        f"### {name}\n\n```json\n{json.dumps(schema, indent=2)}\n```"
        for name, schema in SCHEMAS.items()
    )


def render_cli_commands() -> str:
    """Markdown: every command's usage line and what it does (the first line of its help)."""
    from .cli import cli  # noqa: PLC0415

    rows = ["| usage | what it does |", "|---|---|"]
    root = click.Context(cli, info_name="infervisor")

    def walk(group: click.Group, ctx: click.Context) -> None:
        for name in sorted(group.list_commands(ctx)):
            command = group.get_command(ctx, name)
            assert command is not None
            sub = click.Context(command, info_name=name, parent=ctx)
            if isinstance(command, click.Group):
                walk(command, sub)
                continue
            usage = " ".join(command.collect_usage_pieces(sub))
            what = (command.help or "").strip().splitlines()[0].replace("|", "\\|")
            rows.append(f"| `{sub.command_path} {usage}` | {what} |")

    walk(cli, root)
    return "\n".join(rows)


def render_api_scopes() -> str:
    """Markdown: every route of the control API and the token scope it needs."""
    from .api.scopes import ROUTE_SCOPES  # noqa: PLC0415

    rows = ["| route | scope |", "|---|---|"]
    rows += [f"| `{method} {route}` | {scope.value} |" for method, route, scope in ROUTE_SCOPES]
    return "\n".join(rows)


GENERATORS: dict[str, tuple[str, Callable[[], str]]] = {
    "transitions": ("lifecycle.md", render_transition_table),
    "rules": ("lifecycle.md", render_rule_table),
    "wake": ("lifecycle.md", render_wake_table),
    "reconcile-wake": ("lifecycle.md", render_reconcile_table),
    "status-map": ("status-map.md", render_status_table),
    "cli-commands": ("cli.md", render_cli_commands),
    "cli-codes": ("cli.md", render_cli_codes),
    "cli-schemas": ("cli.md", render_cli_schemas),
    "api-scopes": ("api.md", render_api_scopes),
}


def _section(name: str) -> re.Pattern[str]:
    # Lazy up to the first end marker, so an empty section never swallows the next one.
    return re.compile(
        rf"(<!-- generated: {re.escape(name)} -->\n).*?(<!-- end generated -->)", re.DOTALL
    )


def _escape(replacement: str) -> str:
    return replacement.replace("\\", "\\\\")


def refresh(docs: Path, *, check: bool = False) -> list[str]:
    """Rewrite (or with ``check``, only compare) each generated section; the stale names."""
    stale = []
    for name, (file, render) in GENERATORS.items():
        path = docs / file
        text = path.read_text()
        pattern = _section(name)
        if not pattern.search(text):
            raise ValueError(f"{path}: no generated section named {name!r}")
        new = pattern.sub(rf"\g<1>{_escape(render())}\n\g<2>", text)
        if new != text:
            stale.append(name)
            if not check:
                path.write_text(new)
    return stale


def main() -> None:
    """Rewrite the generated sections under ./docs (``--check``: exit 1 if any is stale)."""
    check = "--check" in sys.argv
    stale = refresh(Path("docs"), check=check)
    for name in stale:
        print(f"{'stale' if check else 'rewrote'}: {name}")
    sys.exit(1 if check and stale else 0)


if __name__ == "__main__":
    main()
