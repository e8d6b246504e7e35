"""Formatting the broker's storage, with the real Kafka StorageTool."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack import kafka_broker
from stack.config import StackSettings


def test_a_cluster_id_starting_with_a_dash_formats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random id is URL-safe base64, one in 64 starts with "-": it must not be read as an
    option (a `make up`, a test run or a benchmark failed that way)."""
    settings = StackSettings(state_dir=tmp_path)
    monkeypatch.setattr(kafka_broker, "_cluster_id", lambda: "-T4bJ3DvQ6-5wGr2C1l1Aw")
    kafka_broker.format_storage(settings, kafka_broker.render_config(settings))
    meta = (tmp_path / "kafka" / "data" / "meta.properties").read_text()
    assert "cluster.id=-T4bJ3DvQ6-5wGr2C1l1Aw" in meta
