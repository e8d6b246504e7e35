"""Run every system on the same data and collect the figures (no formatting here)."""

from __future__ import annotations

import logging
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.dataset import Dataset
from bench.profiles import KEY_SELECTION, Profile, selections
from bench.systems.base import Selection, System

log = logging.getLogger("bench")
# `--only ingest`: every system's load, compaction and storage, nothing after.
INGEST_PART = "ingest"
# `--only queries`: every system's load, compaction and query shapes, nothing after.
QUERIES_PART = "queries"


def time_query(
    system: System,
    data: Dataset,
    selection: Selection,
    repeats: int,
    expected: int,
    fetch: Callable[[Dataset, Selection], Any] | None = None,
) -> dict[str, Any]:
    """Fetch `selection` (by `fetch`, else the system's user layer) once untimed, so that
    every system's client and caches are warm alike, then `repeats` times; check every value
    came back each time; median seconds."""
    fetch = fetch or system.fetch
    runs = []
    for timed in [False] + [True] * repeats:
        start = time.perf_counter()
        fetched = fetch(data, selection)
        if timed:
            runs.append(time.perf_counter() - start)
        got = system.count(fetched)
        del fetched
        if got != expected:
            raise RuntimeError(
                f"{system.label} returned {got} values for {selection.name}, expected {expected}"
            )
    return {"seconds": statistics.median(runs), "runs": runs, "values": expected}


def ingest_phases(system: System, data: Dataset) -> dict[str, Any]:
    """Phase 1, the same for every system: `load` (timed until every reading is queryable)
    then `settle` (what the deployed system does for them after that, at once), in one
    window of the servers' CPU; then the untimed full count."""
    readings = data.spec.readings
    cpu_before = system.servers_cpu_s()
    ingest = system.load(data)
    load_cpu_s = system.servers_cpu_s() - cpu_before
    settled = system.settle(data)
    cpu_s = system.servers_cpu_s() - cpu_before
    if (stored := system.stored(data)) != readings:
        raise RuntimeError(f"{system.label} holds {stored:,} readings, {readings:,} sent")
    log.info(
        "%s: ingest %s readings/s, %.2f µs CPU per reading (%.2f until queryable)",
        system.label,
        f"{ingest.readings_per_s:,.0f}",
        cpu_s / readings * 1e6,
        load_cpu_s / readings * 1e6,
    )
    return {
        "ingest_input": system.ingest_input,
        "ingest_readings_per_s": ingest.readings_per_s,
        "ingest_seconds": ingest.seconds,
        "ingest_cpu_us_per_reading": cpu_s / readings * 1e6,
        "ingest_cpu_us_per_reading_until_queryable": load_cpu_s / readings * 1e6,
        "ingest_detail": ingest.extra,
        **settled,
    }


def compaction_phase(system: System, data: Dataset) -> dict[str, Any]:
    """Phase 2, timed apart: the system's compaction, its wall time and servers' CPU."""
    cpu_before, began = system.servers_cpu_s(), time.monotonic()
    system.compact()
    seconds, cpu_s = time.monotonic() - began, system.servers_cpu_s() - cpu_before
    log.info("%s: compaction %.2f s, %.2f CPU-s", system.label, seconds, cpu_s)
    return {
        "compaction_seconds": seconds,
        "compaction_cpu_s": cpu_s,
        "compaction_cpu_us_per_reading": cpu_s / data.spec.readings * 1e6,
    }


def storage_phase(system: System, data: Dataset) -> dict[str, Any]:
    """Bytes per reading of everything the system stores (every table), and per table."""
    readings = data.spec.readings
    out: dict[str, Any] = {"bytes_per_reading": system.storage_bytes() / readings}
    if by_table := system.storage_by_table():
        out["storage_bytes_by_table"] = by_table
        if "metrics" in by_table:
            out["bytes_per_reading_metrics"] = by_table["metrics"] / readings
    log.info("%s: %.2f bytes per reading", system.label, out["bytes_per_reading"])
    return out


def query_phase(system: System, data: Dataset, profile: Profile, quick: bool) -> dict[str, Any]:
    """Every query shape at the system's user layer (`fetch`, after `prepare_fetch`, told
    whether the run is QUICK), and at its other layers (`query_layers`) beside it under
    `layers`."""
    by_devices, by_window = selections(data.spec)
    queries: dict[str, Any] = {}
    for sel in [*by_devices, *by_window]:
        if sel.name in queries:
            continue
        expected = data.count(list(sel.devices), sel.start_us, sel.end_us, system.timestamp_unit_us)
        prepared = system.prepare_fetch(data, sel, quick=quick)
        q = time_query(system, data, sel, profile.repeats, expected)
        queries[sel.name] = q = {**q, **prepared}
        layers = {
            layer: time_query(system, data, sel, profile.repeats, expected, fetch)["seconds"]
            for layer, fetch in system.query_layers().items()
        }
        if layers:
            q["layers"] = layers
        log.info(
            "%s: %s: %.3f s (%s values)%s",
            system.label,
            sel.name,
            q["seconds"],
            f"{expected:,}",
            "".join(f"; {layer} {s:.3f} s" for layer, s in layers.items()),
        )
    return {
        "queries": queries,
        "query_100dev_10min_s": queries[KEY_SELECTION]["seconds"],
        "query_layer": system.query_layer,
    }


def run_system(
    system: System,
    data: Dataset,
    data_int: Dataset | None,
    profile: Profile,
    quick: bool,
    only: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Everything measured on one system, in one try/finally that stops its servers. With
    `only`: start, load, then just those of the system's extra measurements (no storage,
    query shapes or integer variant); with `ingest` among them, compaction and storage too.
    The integer variant's storage (`data_int`, None otherwise) is a full run's only."""
    result: dict[str, Any] = {"label": system.label}
    step = "start"
    try:
        result["version"] = system.version()
        system.start()
        step = "load"
        log.info("%s: loading %s readings", system.label, f"{data.spec.readings:,}")
        system.warm(data)
        result.update(ingest_phases(system, data))
        if only is None or only & {INGEST_PART, QUERIES_PART}:
            step = "compaction"
            result.update(compaction_phase(system, data))
        if only is None or INGEST_PART in only:
            step = "storage"
            result.update(storage_phase(system, data))
        if only is not None and QUERIES_PART in only:
            step = "queries"
            result.update(query_phase(system, data, profile, quick))
        if only is not None:
            step = "extra measurements"
            result.update(system.extra_measurements(data, quick, only))
            return result
        step = "queries"
        result.update(query_phase(system, data, profile, quick))
        if not quick:  # a second store of each system: QUICK's 6 minutes leave it out
            step = "storage of the integer variant"
            log.info("%s: storage of the integer variant", system.label)
            assert data_int is not None, "a full run generates the integer variant"
            result["bytes_per_reading_int"] = (
                system.storage_bytes_of(data_int) / data_int.spec.readings
            )
        step = "extra measurements"
        result.update(system.extra_measurements(data, quick))
    except Exception as exc:
        log.error("%s failed during %s: %s", system.label, step, exc)
        result["error"] = f"{step}: {type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    finally:
        try:
            system.stop()
        except Exception as exc:
            log.error("%s: stop failed: %s", system.label, exc)
            result.setdefault("error", f"stop: {exc}")
    return result


def run_all(
    factories: dict[str, Callable[[Path], System]],
    workdir: Path,
    data: Dataset,
    data_int: Dataset | None,
    profile: Profile,
    quick: bool,
    only: frozenset[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the systems one after the other, each in its own folder `workdir/<key>`."""
    results = {}
    for key, factory in factories.items():
        system = factory(workdir / key)
        started = time.monotonic()
        results[system.name] = run_system(system, data, data_int, profile, quick, only)
        results[system.name]["wall_seconds"] = round(time.monotonic() - started, 1)
        log.info("%s done in %.0f s", system.label, results[system.name]["wall_seconds"])
    return results
