"""The tables in docs/ are generated from the code and must not be stale."""

from pathlib import Path

from infervisor.tools.docgen import refresh

DOCS = Path(__file__).parent.parent / "docs"


def test_generated_doc_sections_are_current() -> None:
    assert refresh(DOCS, check=True) == [], "run: python -m infervisor.tools.docgen"


def test_every_wake_reason_is_in_the_rule_and_in_words() -> None:
    from infervisor.actors.core.wake import WAKE_MEANINGS, WAKE_RULES, Wake

    assert [reason for reason, _ in WAKE_RULES] == list(Wake) == list(WAKE_MEANINGS)
