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

from bench import report
from bench import results as result_files
from bench.dataset import START, load_or_generate
from bench.machine import LoadSampler
from bench.profiles import FULL, QUICK
from bench.runner import INGEST_PART, QUERIES_PART, run_all
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
# naming nothing else, the storage part (data set, systems' load) is skipped.
POLLING_STEPS = ("snmp", "ipmi", "ondemand", "prometheus", "wattmeter", "live", "remote_write")
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

    polling_only = only is not None and not storage_only
    with LoadSampler() as machine:
        if not polling_only:
            started = time.monotonic()
            data = load_or_generate(profile.spec(), state / "data")
            data_int = load_or_generate(profile.spec(integer=True), state / "data")
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
        report.write_json(out / "bench-results.json", results)
        kept = result_files.write(results, argv, vars(args), args.results_dir)
        print(report.polling_markdown(results))
        print(f"\nWrote {out / 'bench-results.json'}.")
        print(f"Result file: {kept}")
        return 1 if results["errors"] else 0
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
    kept = result_files.write(results, argv, vars(args), args.results_dir)
    pngs = report.plots(systems, out / "bench-plots", data.spec.duration_s / 60)
    print(report.markdown(systems, results))
    if polling:
        print("\n" + report.polling_markdown(results))
    print(f"\nWrote {out / 'bench-results.json'} and {len(pngs)} plots in {out / 'bench-plots'}.")
    print(f"Result file: {kept}")
    return 1 if results["errors"] else 0


def run_polling(
    steps: list[str], state_dir: Path, quick: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each polling benchmark's top-level keys, and the errors of those that failed. A
    benchmark whose module is missing is reported as not available."""
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for step in steps:
        name = f"bench.polling.{step}"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module is there, something it imports is not
                log.exception("polling benchmark %s cannot run", step)
                errors[f"polling.{step}"] = f"{type(exc).__name__}: {exc}"
                continue
            log.warning("%s: not available (no bench/polling/%s.py)", step, step)
            results.setdefault("polling_not_available", []).append(step)
            continue
        log.info("polling benchmark: %s", step)
        try:
            results.update(module.measure(state_dir, quick))
        except Exception as exc:
            log.exception("polling benchmark %s failed", step)
            errors[f"polling.{step}"] = f"{type(exc).__name__}: {exc}"
    return results, errors


if __name__ == "__main__":
    sys.exit(main())
