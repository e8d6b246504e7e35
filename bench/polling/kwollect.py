"""Kwollect 1.3.1 as a peer of the polling benchmarks: its collectors' venv (`kwollector` for
SNMP, `kwollector-wattmetre` for wattmeters) and the tables they write in PostgreSQL
(Kwollect's schema, bench/kwollect_schema.py)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import psycopg

from bench import kwollect_schema
from bench.kwollect_schema import US
from stack.venvs import pinned_venv

log = logging.getLogger("bench.kwollect")

KWOLLECT_REQUIREMENTS = Path(__file__).resolve().parent / "kwollect-requirements.txt"

LIVE_SPAN_S = 24 * 3600
"""The tables' partitions hold readings from this long before now to this long after."""


def create_tables(conn: psycopg.Connection) -> None:
    """Kwollect's tables (bench/kwollect_schema.py), partitioned around now, for collectors
    that write readings of now."""
    now_us = int(time.time()) * US
    kwollect_schema.create(conn, "metrics", now_us - LIVE_SPAN_S * US, now_us + LIVE_SPAN_S * US)


def kwollect_venv(state_dir: Path) -> Path:
    """A venv with kwollect and its pinned dependencies (installed once per requirements)."""
    log.info("kwollect's venv: %s", state_dir / "kwollect-venv")
    # No `pip check`: kwollect pins psycopg2-binary==2.9.3 (no wheel for Python 3.11); the
    # requirements hold a newer one, which kwollector-wattmetre imports.
    return pinned_venv(
        state_dir / "kwollect-venv", KWOLLECT_REQUIREMENTS, Path(sys.executable), check=False
    )
