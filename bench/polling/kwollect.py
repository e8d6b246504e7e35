"""Kwollect 1.3.1 as a peer of the polling benchmarks: its collectors' venv (`kwollector` for
SNMP, `kwollector-wattmetre` for wattmeters) and the tables they write in PostgreSQL."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from stack.venvs import pinned_venv

log = logging.getLogger("bench.kwollect")

KWOLLECT_REQUIREMENTS = Path(__file__).resolve().parent / "kwollect-requirements.txt"

KWOLLECT_TABLES = """
CREATE TABLE metrics (
  timestamp   TIMESTAMPTZ       DEFAULT NOW(),
  device_id   TEXT              NOT NULL,
  metric_id   TEXT              NOT NULL,
  value       DOUBLE PRECISION  DEFAULT 'NaN',
  labels      JSONB             DEFAULT '{}'::JSONB
);
CREATE INDEX metrics_device_idx ON metrics(device_id, timestamp DESC);
CREATE TABLE promoted_metrics (
  device_id   TEXT              NOT NULL,
  metric_id   TEXT              DEFAULT NULL
);
"""
"""The two tables Kwollect's collectors use (`promoted_metrics`: on-demand metrics)."""


def kwollect_venv(state_dir: Path) -> Path:
    """A venv with kwollect and its pinned dependencies (installed once per requirements)."""
    log.info("kwollect's venv: %s", state_dir / "kwollect-venv")
    # No `pip check`: kwollect pins psycopg2-binary==2.9.3 (no wheel for Python 3.11); the
    # requirements hold a newer one, which kwollector-wattmetre imports.
    return pinned_venv(
        state_dir / "kwollect-venv", KWOLLECT_REQUIREMENTS, Path(sys.executable), check=False
    )
