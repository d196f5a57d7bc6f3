"""docs/security.md names the test that shows each control: every file it links exists, every heading
it links to is there, and every test it names is defined in a test file it links."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "security.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def linked() -> list[tuple[Path, str | None]]:
    return [((DOC.parent / target).resolve(), anchor) for target, anchor in LINK.findall(DOC.read_text())]


def test_every_link_of_the_security_page_reaches_a_file_and_heading() -> None:
    missing = [(str(path.relative_to(ROOT)), anchor) for path, anchor in linked()
               if not path.is_file() or (anchor and path.suffix == ".md" and anchor not in anchors(path))]
    assert missing == []


def test_every_test_the_security_page_names_is_defined_in_a_file_it_links() -> None:
    defined = {name for path, _ in linked() if path.suffix == ".py"
               for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE)}
    named = set(re.findall(r"`(test_\w+)`", DOC.read_text()))
    assert len(named) > 30
    assert named - defined == set()
