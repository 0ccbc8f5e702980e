"""The tables in docs/ are generated from the code and must not be stale."""

from pathlib import Path

from infervisor.tools.docgen import refresh

DOCS = Path(__file__).parent.parent / "docs"


def test_generated_doc_sections_are_current() -> None:
    assert refresh(DOCS, check=True) == [], "run: python -m infervisor.tools.docgen"
