"""`python -m bench [--quick]`: jobscope and its peers on the same data, in one run.

Prints a Markdown table, writes bench-results.json and bench-plots/*.png at the repository
root, and the run's result file in bench/results/ (bench/results.py). Every server it starts
lives under state/bench/ and is stopped before it exits.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report, scale
from bench import results as result_files
from bench.dataset import START, load_or_generate
from bench.machine import LoadSampler
from bench.polling.producer import PollingStack
from bench.profiles import FULL, QUICK
from bench.runner import INGEST_PART, QUERIES_PART, run_all
from bench.scale import ScaleSpec
from bench.systems.base import System
from bench.systems.jobscope import Jobscope
from bench.systems.postgres import Postgres
from bench.systems.victoriametrics import VictoriaMetrics

REPO_ROOT = Path(__file__).resolve().parent.parent
SYSTEMS: dict[str, Callable[[Path], System]] = {
    "jobscope": Jobscope,
    "victoriametrics": VictoriaMetrics,
    "postgres": Postgres,
}
# jobscope's extra measurements (--only); `ingest` (bench/runner.py INGEST_PART): every
# system's load, compaction and storage alone; `queries` (QUERIES_PART): every system's load,
# compaction and query shapes alone
ONLY_STEPS = (INGEST_PART, QUERIES_PART, "rollups", "freshness", "api", "abuse", "floor", "drain")
# Producers' polling benchmarks (bench/polling/<step>.py), after the storage part; with --only
# naming nothing else, the storage part (data set, systems' load) is skipped. They share one
# stack (bench/polling/producer.py PollingStack), each part of it started when first needed:
# those that need Kafka alone first (as before, nothing else of the stack beside them), then
# those that need ClickHouse and the API; remote_write last (it leaves ClickHouse a backlog).
POLLING_STEPS = ("snmp", "prometheus", "wattmeter", "ipmi", "ondemand", "live", "remote_write")
log = logging.getLogger("bench")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.devices} devices x {QUICK.duration_s // 60} min instead of "
        f"{FULL.devices} x {FULL.duration_s // 60} min (same code paths)",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="the scale profile (bench/scale.py): each system holding a day, then a week, of "
        "a fleet generated straight into it, the same job queries at each level; within "
        "45 minutes",
    )
    parser.add_argument(
        "--scale-devices",
        type=int,
        default=ScaleSpec.devices,
        help="the scale profile's fleet (x 100 metrics every 5 s); fewer for development",
    )
    parser.add_argument(
        "--scale-days",
        default=",".join(map(str, ScaleSpec.levels_days)),
        help="the scale profile's levels, in days held, growing (default: a day, then a week)",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated subset of: " + ", ".join(SYSTEMS) + " (default: all; "
        "jobscope with --only, unless it names ingest or queries)",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated jobscope measurements to run alone after the load (no storage, "
        "query shapes or integer variant): " + ", ".join(ONLY_STEPS) + "; and/or polling "
        "benchmarks alone (no data set, no load): " + ", ".join(POLLING_STEPS),
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=REPO_ROOT / "state" / "bench",
        help="servers' data and the cached data sets",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=REPO_ROOT,
        help="where bench-results.json and bench-plots/ are written",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=result_files.RESULTS_DIR,
        help="where the run's result file <date>-<commit>-<profile>.json is written (the "
        "files the docs' figures are generated from: python -m bench.publish)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started_on = result_files.commit()  # the code that runs (the tree may move on meanwhile)
    only = None
    if args.only is not None:
        only = frozenset(s.strip() for s in args.only.split(",") if s.strip())
        if not only or only - set(ONLY_STEPS) - set(POLLING_STEPS):
            log.error("--only takes some of: %s", ", ".join(ONLY_STEPS + POLLING_STEPS))
            return 2
    storage_only = only & set(ONLY_STEPS) if only else None
    polling = [s for s in POLLING_STEPS if only is None or s in only]
    jobscope_only = only is not None and not only & {INGEST_PART, QUERIES_PART}
    systems_arg = args.systems or ("jobscope" if jobscope_only else ",".join(SYSTEMS))
    chosen = [s.strip() for s in systems_arg.split(",") if s.strip()]
    unknown = set(chosen) - set(SYSTEMS)
    if unknown:
        log.error("unknown system(s): %s", ", ".join(sorted(unknown)))
        return 2
    profile = QUICK if args.quick else FULL
    state = args.state_dir.resolve()
    if args.scale:
        return run_scale(args, argv, chosen, state, started_on)

    polling_only = only is not None and not storage_only
    with LoadSampler() as machine:
        if not polling_only:
            started = time.monotonic()
            data = load_or_generate(profile.spec(), state / "data")
            # the integer variant's store: a full run's, without --only (runner.run_system)
            data_int = (
                load_or_generate(profile.spec(integer=True), state / "data")
                if only is None and not args.quick
                else None
            )
            prepare_s = time.monotonic() - started
            log.info("data: %s (ready in %.1f s)", data.spec.describe(), prepare_s)
            systems = run_all(
                {k: SYSTEMS[k] for k in chosen},
                state / "runs",
                data,
                data_int,
                profile,
                args.quick,
                storage_only,
            )
        polled, polling_errors = run_polling(polling, state / "polling", args.quick)

    out = args.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if polling_only:
        assert only is not None
        results: dict[str, Any] = {
            "profile": profile.name,
            "only": sorted(only),
            **polled,
            "machine": machine.summary(),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "errors": polling_errors,
        }
        return _kept(results, report.polling_markdown(results), args, argv, started_on)
    results = report.flatten(
        systems,
        {
            **polled,
            "profile": profile.name,
            "only": sorted(only) if only else None,
            "dataset": {
                "description": data.spec.describe(),
                "readings": data.spec.readings,
                "devices": data.spec.devices,
                "metrics": data.spec.metrics,
                "period_s": data.spec.period_s,
                "duration_s": data.spec.duration_s,
                "start": START.isoformat(),
                "seed": data.spec.seed,
                "prepare_seconds": round(prepare_s, 1),
            },
            "machine": machine.summary(),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    )
    results["errors"].update(polling_errors)
    report.write_json(out / "bench-results.json", results)
    kept = result_files.write(results, argv, vars(args), args.results_dir, started_on)
    pngs = report.plots(systems, out / "bench-plots", data.spec.duration_s / 60)
    print(report.markdown(systems, results))
    if polling:
        print("\n" + report.polling_markdown(results))
    print(f"\nWrote {out / 'bench-results.json'} and {len(pngs)} plots in {out / 'bench-plots'}.")
    print(f"Result file: {kept}")
    return 1 if results["errors"] else 0


def run_scale(
    args: argparse.Namespace,
    argv: list[str],
    chosen: list[str],
    state: Path,
    started_on: dict[str, Any],
) -> int:
    """The scale profile alone: its table, bench-results.json and its result file."""
    days = tuple(int(d) for d in args.scale_days.split(",") if d.strip())
    if not days or list(days) != sorted(set(days)) or args.scale_devices < 1:
        log.error("--scale-days takes growing whole days (1,7), --scale-devices at least 1")
        return 2
    spec = ScaleSpec(devices=args.scale_devices, levels_days=days)
    with LoadSampler() as machine:
        measured = scale.run(chosen, spec, state)
    results: dict[str, Any] = {
        "profile": spec.profile(),
        "only": None,
        **scale.flat(measured),
        "machine": machine.summary(),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "errors": {k: s["error"] for k, s in measured["systems"].items() if s.get("error")},
    }
    return _kept(results, scale.markdown(measured), args, argv, started_on)


def _kept(
    results: dict[str, Any],
    table: str,
    args: argparse.Namespace,
    argv: list[str],
    started_on: dict[str, Any],
) -> int:
    """A run without plots: bench-results.json and its result file written, its table
    printed; 1 if a part failed."""
    out = args.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "bench-results.json", results)
    kept = result_files.write(results, argv, vars(args), args.results_dir, started_on)
    print(table)
    print(f"\nWrote {out / 'bench-results.json'}.")
    print(f"Result file: {kept}")
    return 1 if results["errors"] else 0


def run_polling(
    steps: list[str], state_dir: Path, quick: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each polling benchmark's top-level keys, and the errors of those that failed, all in
    one stack (`PollingStack`, stopped at the end); `polling_wall_seconds`: each one's wall
    time (the stack's starts in the first that needs each part). A benchmark whose module is
    missing is reported as not available."""
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if not steps:
        return results, errors
    with PollingStack(state_dir / "stack") as stack:
        for step in steps:
            began = time.monotonic()
            _run_polling_step(step, state_dir, quick, stack, results, errors)
            wall = results.setdefault("polling_wall_seconds", {})
            wall[step] = round(time.monotonic() - began, 1)
            log.info("polling benchmark %s done in %.0f s", step, wall[step])
    return results, errors


def _run_polling_step(
    step: str,
    state_dir: Path,
    quick: bool,
    stack: PollingStack,
    results: dict[str, Any],
    errors: dict[str, str],
) -> None:
    """One polling benchmark's keys into `results`, or its error into `errors`."""
    name = f"bench.polling.{step}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:  # the module is there, something it imports is not
            log.exception("polling benchmark %s cannot run", step)
            errors[f"polling.{step}"] = f"{type(exc).__name__}: {exc}"
            return
        log.warning("%s: not available (no bench/polling/%s.py)", step, step)
        results.setdefault("polling_not_available", []).append(step)
        return
    log.info("polling benchmark: %s", step)
    try:
        results.update(module.measure(state_dir, quick, stack))
    except Exception as exc:
        log.exception("polling benchmark %s failed", step)
        errors[f"polling.{step}"] = f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
