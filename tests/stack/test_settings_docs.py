"""The manual's settings tables are those the code has (stack/settings_docs.py)."""

from __future__ import annotations

from stack.settings_docs import DOC, render


def test_the_manual_lists_every_setting_as_the_code_has_it() -> None:
    assert DOC.read_text() == render(), "stale: run `.venv/bin/python -m stack.settings_docs`"


def test_every_setting_says_what_it_is() -> None:
    """The generated page is the manual of every setting: none is listed without a meaning."""
    blank = [
        line for line in render().splitlines() if line.startswith("| `") and line.endswith("|  |")
    ]
    assert not blank, blank


def test_the_guide_restates_no_setting_table() -> None:
    """docs/configuring.md explains how settings combine; their table is the generated page."""
    guide = (DOC.parent / "configuring.md").read_text()
    assert "| variable |" not in guide and "configuration.md" in guide
