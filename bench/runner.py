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


def time_query(
    system: System, data: Dataset, selection: Selection, repeats: int, expected: int
) -> dict[str, Any]:
    """Fetch `selection` `repeats` times; check every value came back; median seconds."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fetched = system.fetch(data, selection)
        runs.append(time.perf_counter() - start)
        got = system.count(fetched)
        del fetched
        if got != expected:
            raise RuntimeError(
                f"{system.label} returned {got} values for {selection.name}, expected {expected}"
            )
    return {"seconds": statistics.median(runs), "runs": runs, "values": expected}


def run_system(
    system: System,
    data: Dataset,
    data_int: Dataset,
    profile: Profile,
    quick: bool,
    only: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Everything measured on one system, in one try/finally that stops its servers. With
    `only`: start, load, then just those of the system's extra measurements (no storage,
    query shapes or integer variant)."""
    result: dict[str, Any] = {"label": system.label}
    step = "start"
    try:
        result["version"] = system.version()
        system.start()
        step = "load"
        log.info("%s: loading %s readings", system.label, f"{data.spec.readings:,}")
        system.warm(data)
        cpu_before = system.servers_cpu_s()
        ingest = system.load(data)
        cpu_s = system.servers_cpu_s() - cpu_before
        result["ingest_cpu_us_per_reading"] = cpu_s / data.spec.readings * 1e6
        result["ingest_readings_per_s"] = ingest.readings_per_s
        result["ingest_seconds"] = ingest.seconds
        result["ingest_detail"] = ingest.extra
        if only is not None:
            step = "extra measurements"
            result.update(system.extra_measurements(data, quick, only))
            return result
        step = "storage"
        result["bytes_per_reading"] = system.storage_bytes() / data.spec.readings
        step = "queries"
        by_devices, by_window = selections(data.spec)
        queries: dict[str, Any] = {}
        for sel in [*by_devices, *by_window]:
            if sel.name in queries:
                continue
            expected = data.count(
                list(sel.devices), sel.start_us, sel.end_us, system.timestamp_unit_us
            )
            queries[sel.name] = time_query(system, data, sel, profile.repeats, expected)
            log.info(
                "%s: %s: %.3f s (%s values)",
                system.label,
                sel.name,
                queries[sel.name]["seconds"],
                f"{expected:,}",
            )
        result["queries"] = queries
        result["query_100dev_10min_s"] = queries[KEY_SELECTION]["seconds"]
        # Before the extra measurements: jobscope's rollups step waits for the ingest's minute
        # to pass, and this fills part of that wait.
        step = "storage of the integer variant"
        log.info("%s: storage of the integer variant", system.label)
        result["bytes_per_reading_int"] = system.storage_bytes_of(data_int) / data_int.spec.readings
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
    data_int: Dataset,
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
