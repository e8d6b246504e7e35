"""The README is the door, docs/ the manual: the README stays short, and every relative link
of every Markdown file of the repository leads to a file that exists (and, with an anchor, to
a heading of that file)."""

from __future__ import annotations

import re
from pathlib import Path

from stack.config import REPO_ROOT
from tests.conftest import tracked_files

README_MOST_LINES = 200
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    text = FENCE.sub("", path.read_text())
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        found.add(slug)
    return found


def broken_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_resolves() -> None:
    files = tracked_files("*.md")
    assert REPO_ROOT / "README.md" in files and len(files) > 10, files
    broken = {str(p.relative_to(REPO_ROOT)): b for p in files if (b := broken_links(p))}
    assert not broken, broken


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    """The check itself can fail: a missing file and a missing heading are both reported."""
    (tmp_path / "other.md").write_text("# A title\n")
    page = tmp_path / "page.md"
    page.write_text("[a](missing.md) [b](other.md#a-title) [c](other.md#nothing) [d](https://x)\n")
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nothing (no such heading)"]


def test_the_readme_is_a_door() -> None:
    """What, the two commands, the map, links: the manual is docs/."""
    lines = (REPO_ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines: move sections to docs/"
