"""Tables in docs/ generated from the code, so the documents cannot drift.

``python -m infervisor.tools.docgen`` rewrites the generated sections of
``docs/lifecycle.md`` and ``docs/status-map.md``; a test checks they match.
A generated section sits between ``<!-- generated: NAME -->`` and
``<!-- end generated -->``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from infervisor.actors.core.decide import RULES
from infervisor.adapters.status import MAP_REPORT_CASES
from infervisor.replay.lifecycle import LIVE_STATES, TRANSITIONS

__all__ = [
    "GENERATORS",
    "refresh",
    "render_rule_table",
    "render_status_table",
    "render_transition_table",
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
    rows = ["| # | when | state | detail |", "|---|---|---|---|"]
    for i, case in enumerate(MAP_REPORT_CASES, 1):
        detail = f"`{case.detail}`" if case.detail else "—"
        rows.append(f"| {i} | {case.description} | `{case.state}` | {detail} |")
    return "\n".join(rows)


def render_rule_table() -> str:
    """Markdown: every observation the decision core takes and the rule that decides it."""
    rows = ["| observation | rule | what it decides |", "|---|---|---|"]
    for obs, rule in RULES.items():
        doc = (obs.__doc__ or "").strip().splitlines()[0]
        what = (rule.__doc__ or "").strip().splitlines()[0]
        where = f"`{rule.__module__.rsplit('.', 1)[-1]}.{rule.__name__}`"
        rows.append(f"| `{obs.__name__}`: {doc} | {where} | {what} |")
    return "\n".join(rows)


GENERATORS: dict[str, tuple[str, Callable[[], str]]] = {
    "transitions": ("lifecycle.md", render_transition_table),
    "rules": ("lifecycle.md", render_rule_table),
    "status-map": ("status-map.md", render_status_table),
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
