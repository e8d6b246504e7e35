"""The shipped alert rules (monitoring/alerts.yml) are valid Prometheus rules, and promtool's
unit tests (monitoring/alerts.test.yml) show each alert firing on its condition and not on a
healthy series."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from stack.config import REPO_ROOT

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
RULES = REPO_ROOT / "monitoring" / "alerts.yml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
    )


def test_rules_check() -> None:
    done = promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 13 rules found" in done.stdout


def test_rules_unit_tests() -> None:
    done = promtool("test", "rules", "alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_shown_firing() -> None:
    """An alert added to the rules without a unit test showing it fire fails here."""
    rules = yaml.safe_load(RULES.read_text())
    alerts = [rule["alert"] for group in rules["groups"] for rule in group["rules"]]
    tests = yaml.safe_load((RULES.parent / "alerts.test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert len(alerts) == 13
    assert set(alerts) <= fired, f"never shown firing: {sorted(set(alerts) - fired)}"
