"""The manual's settings tables are those the code has (stack/settings_docs.py)."""

from __future__ import annotations

from stack.settings_docs import DOC, render


def test_the_manual_lists_every_setting_as_the_code_has_it() -> None:
    assert DOC.read_text() == render(), "stale: run `.venv/bin/python -m stack.settings_docs`"
