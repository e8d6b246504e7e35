"""The rendered server.properties carries the broker settings of stack/config.py."""

from __future__ import annotations

from pathlib import Path

from stack import kafka_broker
from stack.config import StackSettings


def _properties(settings: StackSettings) -> dict[str, str]:
    text = kafka_broker.render_config(settings).read_text()
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: value for key, value in pairs if not key.startswith("#")}


def test_fencing_keeps_kafkas_defaults_and_follows_a_shorter_session(tmp_path: Path) -> None:
    """Operators keep Kafka's 9 s session and 2 s heartbeat; a shorter session (the suite's
    broker-loss test) heartbeats every quarter of it."""
    default = _properties(StackSettings(state_dir=tmp_path / "a"))
    assert default["broker.session.timeout.ms"] == "9000"
    assert default["broker.heartbeat.interval.ms"] == "2000"
    short = _properties(
        StackSettings(state_dir=tmp_path / "b", kafka_broker_session_timeout_ms=4000)
    )
    assert short["broker.session.timeout.ms"] == "4000"
    assert short["broker.heartbeat.interval.ms"] == "1000"
