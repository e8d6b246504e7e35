"""The note rules (api/notes.py): the shipped file loads; a file with errors is refused
naming file, line and field; the condition language refuses anything but its typed
conditions (code, regular expressions, YAML tags and alias bombs are refused at load); each
shipped rule fires on a crafted summary and stays silent on a healthy one. The API refuses
to start on a bad rules file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from api import notes
from api.notes import NoteRulesError

GOOD_RULE = """\
rules:
  - id: busy
    severity: info
    when:
      footprint: {metric: "bmc_*", position_above: 0.5}
    text: "$nodes were busy"
"""


def _load(tmp_path: Path, text: str) -> notes.Rules:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return notes.load(path)


def _refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(NoteRulesError) as caught:
        _load(tmp_path, text)
    return str(caught.value)


def test_the_shipped_rules_load() -> None:
    ids = [rule.id for rule in notes.load(notes.SHIPPED).rules]
    assert ids == ["node-power-idle", "node-silent", "energy-coverage-low", "gpu-idle"]


def test_errors_name_file_line_and_field(tmp_path: Path) -> None:
    text = GOOD_RULE + (
        "  - id: second\n"
        "    severity: critical\n"  # line 8: not a severity
        "    when:\n"
        "      silent: {seconds_above: -1}\n"  # line 10
        "    text: x\n"
    )
    message = _refused(tmp_path, text)
    path = tmp_path / "rules.yaml"
    assert f"{path}:8: rules[second].severity:" in message, message
    assert f"{path}:10: rules[second].when.silent.seconds_above:" in message, message
    unknown = GOOD_RULE.replace("$nodes were busy", "$nodes used $watts")
    assert "rules[busy].text" in _refused(tmp_path, unknown)
    assert f"{path}:2: (yaml)" in _refused(tmp_path, "rules:\n  - id: ]\n")


@pytest.mark.parametrize(
    "when",
    [
        # code, in every shape a rule could try to smuggle it
        "expr: \"__import__('os').system('touch /tmp/pwned')\"",
        'footprint: {metric: "bmc_*", position_above: 0.5, eval: "1+1"}',
        "metadata: [{field: __class__, equals: x}]",
        # a regular expression bomb: neither a regex key nor regex syntax in a glob
        'footprint: {metric: "(a+)+$", position_above: 0.5}',
        'regex: "(a|aa)*b"',
        'footprint: {metric: "' + "*a" * 8 + '", position_above: 0.5}',
        # a level between tenths, a text field compared as a number
        'footprint: {metric: "bmc_*", position_below: 0.15}',
        "metadata: [{field: user, above: 3}]",
    ],
)
def test_the_condition_language_refuses_anything_else(tmp_path: Path, when: str) -> None:
    text = f"rules:\n  - id: r\n    severity: info\n    when:\n      {when}\n    text: t\n"
    assert "rules[r].when" in _refused(tmp_path, text)


def test_templates_and_yaml_cannot_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for text in (
        GOOD_RULE.replace("$nodes were busy", "${nodes.__class__}"),
        GOOD_RULE.replace("$nodes were busy", "{nodes.__class__.__mro__}$__import__"),
        GOOD_RULE.replace("link: x", "").replace(
            "    text:", '    link: "javascript:alert(1)"\n    text:'
        ),
        GOOD_RULE.replace("    text:", '    link: "/x/$__globals__"\n    text:'),
    ):
        assert "rules[busy]" in _refused(tmp_path, text)
    tagged = f"rules: !!python/object/apply:os.system ['touch {marker}']\n"
    assert "(yaml): tags are not accepted" in _refused(tmp_path, tagged)
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n'
    assert "anchors and aliases are not accepted" in _refused(tmp_path, bomb + "rules: []\n")
    assert not marker.exists()


def _node(name: str, idle_tenths: float, position: float) -> dict[str, Any]:
    return {
        "node": name,
        "position": position,
        "deciles": [idle_tenths] + [0.0] * 8 + [1 - idle_tenths],
    }


def _summary(**changes: Any) -> dict[str, Any]:
    """A healthy two-node job: busy power and GPUs, no silence, energy covering it."""
    summary: dict[str, Any] = {
        "duration_s": 600.0,
        "footprint": [
            {"metric_id": "bmc_power_watt", "nodes": [_node("n1", 0.1, 0.9), _node("n2", 0, 1)]},
            {"metric_id": "DCGM_FI_DEV_GPU_UTIL", "nodes": [_node("n1", 0.0, 0.95)]},
        ],
        "silent": [],
        "energy": [
            {"node": n, "covered_s": 598.0, "joules": 1e5, "pushed": False} for n in ("n1", "n2")
        ],
    }
    summary.update(changes)
    return summary


JOB = {"job_id": "42", "user": "alice", "project": "p", "nodes": ["n1", "n2"]}


def _fired(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in notes.evaluate(notes.load(notes.SHIPPED), JOB, summary)}


def test_shipped_rules_are_silent_on_a_healthy_job() -> None:
    assert _fired(_summary()) == {}


def test_each_shipped_rule_fires_on_its_case() -> None:
    idle = _summary(
        footprint=[
            {"metric_id": "bmc_power_watt", "nodes": [_node("n1", 0.95, 0.02), _node("n2", 0, 1)]},
            {"metric_id": "DCGM_FI_DEV_GPU_UTIL", "nodes": [_node("n1", 0.9, 0.05)]},
        ],
        silent=[{"node": "n2", "silent_s": 120.0, "fraction": 0.2, "spans": []}],
        energy=[{"node": "n1", "covered_s": 300.0, "joules": 1.0, "pushed": False}],
    )
    fired = _fired(idle)
    assert set(fired) == {"node-power-idle", "node-silent", "energy-coverage-low", "gpu-idle"}
    assert fired["node-power-idle"]["nodes"] == ["n1"]
    assert "bmc_power_watt" in fired["node-power-idle"]["text"]
    assert "95%" in fired["node-power-idle"]["text"]
    assert fired["node-silent"]["nodes"] == ["n2"] and "120 s" in fired["node-silent"]["text"]
    # n1 covers half the job, n2 has no energy at all
    assert fired["energy-coverage-low"]["nodes"] == ["n1", "n2"]
    assert fired["gpu-idle"]["link"] == "/api/jobs/42/report"
    assert notes.worst(list(fired.values())) == "warning"


def test_the_api_refuses_to_start_on_a_bad_rules_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD_RULE.replace("info", "loud"))
    done = subprocess.run(
        [sys.executable, "-m", "api"],
        env={
            "JOBSCOPE_NOTE_RULES": str(path),
            "JOBSCOPE_CLICKHOUSE_API_PASSWORD": "not-used-the-api-stops-before",
            "PATH": "/usr/bin",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{path}:3: rules[busy].severity" in done.stderr
