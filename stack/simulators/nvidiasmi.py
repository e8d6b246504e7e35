"""A stand-in for `nvidia-smi --query-gpu` where there is no GPU (tests, `make up`): it answers
from outputs recorded on an NVIDIA H100 (stack/simulators/gpu/), one recorded row per call.

    python -m stack.simulators.nvidiasmi --query-gpu=index,power.draw --format=csv,noheader
    python -m stack.simulators.nvidiasmi --gpus 4 --state /tmp/smi.n --query-gpu=... --format=...

- Rows: the recording's rows in order, one per call with `--state FILE` (the call counter,
  kept in FILE), else the row of the wall clock (the recording's 500 ms period, in a loop).
  With `--gpus N` it presents N GPUs: GPU k has index k, its UUID's last four digits
  replaced by k (GPU 0 keeps the recorded one) and row k ahead of GPU 0's, so the GPUs of a
  host differ.
- Fields: the recorded columns (`power.draw`, `memory.used`, `clocks.current.sm`,
  `clocks_event_reasons.active`...), a few of nvidia-smi's aliases, and
  `total_energy_consumption` (mJ), read off the NVML samples recorded over the same minute
  (the GPU's own energy counter, interpolated linearly at the row's instant; it keeps
  growing when the rows start again). `noheader` and
  `nounits` of `--format` are honoured (the recording has both a header and units).
- Faults: `--na FIELD` / `--not-supported FIELD` answer `[N/A]` / `[Not Supported]`;
  `--no-energy` makes `total_energy_consumption` an unknown field (an older driver's
  nvidia-smi); an unknown field prints `Field "X" is not a valid field to query.` and exits
  2; `--fail STATUS` prints `--fail-message` on stderr and exits STATUS.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import fcntl
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

RECORDINGS = Path(__file__).resolve().parent / "gpu"
RECORDED_PERIOD_S = 0.5
"""The load recording's sampling period: the wall-clock replay's row period."""
ENERGY_FIELD = "total_energy_consumption"
Energy = tuple[list[float], list[float]]
"""The energy counter's recorded samples: (seconds since the epoch, mJ)."""
ALIASES = {
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
}


def recording(name: str) -> tuple[list[str], list[dict[str, str]]]:
    """(headers, rows: field -> recorded text) of `nvidia-smi-query.<name>.csv` or a path."""
    path = Path(name) if "/" in name else RECORDINGS / f"nvidia-smi-query.{name}.csv"
    with path.open(newline="") as file:
        lines = list(csv.reader(file, skipinitialspace=True))
    headers = [cell.strip() for cell in lines[0]]
    fields = [header.split(" [")[0] for header in headers]
    return headers, [dict(zip(fields, row, strict=True)) for row in lines[1:] if row]


def energy_counter() -> Energy:
    """(seconds since the epoch, mJ) of the recorded NVML samples, one per instant."""
    samples = json.loads((RECORDINGS / "nvml-samples.json").read_text())
    points = sorted({s["t"]: float(s["energy_mj_total"]) for s in samples}.items())
    return [t for t, _ in points], [e for _, e in points]


def energy_at(instant: float, times: Sequence[float], values: Sequence[float]) -> float:
    """The counter at `instant`, linear between samples, the end values outside them."""
    i = bisect.bisect_left(times, instant)
    if i == 0:
        return values[0]
    if i == len(times):
        return values[-1]
    share = (instant - times[i - 1]) / (times[i] - times[i - 1])
    return values[i - 1] + share * (values[i] - values[i - 1])


def next_call(state: Path | None) -> int:
    """The number of this call (0 first) with a state file, else the wall clock's row."""
    if state is None:
        return int(time.time() / RECORDED_PERIOD_S)
    with state.open("a+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        call = int(file.read() or 0)
        file.seek(0)
        file.truncate()
        file.write(str(call + 1))
    return call


def row_instant(row: dict[str, str]) -> float:
    stamp = datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f")
    return stamp.replace(tzinfo=UTC).timestamp()


def gpu_row(rows: list[dict[str, str]], at: int, gpu: int, energy: Energy) -> dict[str, str]:
    """Row `at` (in a loop over the rows) presented as GPU `gpu`, with its energy counter
    (with its unit), which keeps growing from one loop to the next."""
    row = dict(rows[at % len(rows)])
    if gpu:
        row["index"] = str(gpu)
        row["uuid"] = f"{row['uuid'][:-4]}{gpu:04x}"
    first, last = (energy_at(row_instant(rows[i]), *energy) for i in (0, -1))
    per_loop = (last - first) * len(rows) / max(len(rows) - 1, 1)
    counter = energy_at(row_instant(row), *energy) + at // len(rows) * per_loop
    row[ENERGY_FIELD] = f"{round(counter)} mJ"
    return row


def value(text: str, units: bool) -> str:
    """A recorded value with or without its unit (`70.67 W` or `70.67`; `[N/A]` as is)."""
    if units or text.startswith("[") or " " not in text:
        return text
    number, _, _unit = text.rpartition(" ")
    return number


def answer(args: argparse.Namespace) -> int:
    headers, rows = recording(args.recording)
    known = set(rows[0]) | set(ALIASES) | (set() if args.no_energy else {ENERGY_FIELD})
    fields = [field.strip() for field in args.query_gpu.split(",")]
    for field in fields:
        if field not in known:
            print(f'Field "{field}" is not a valid field to query.')
            return 2
    formats = set(args.format.split(","))
    if "csv" not in formats:
        print(f'"{args.format}" is not a valid format: csv[,noheader][,nounits]')
        return 2
    if "noheader" not in formats:
        by_field = {h.split(" [")[0]: h for h in headers} | {ENERGY_FIELD: f"{ENERGY_FIELD} [mJ]"}
        print(", ".join(by_field.get(ALIASES.get(f, f), f) for f in fields))
    call = next_call(args.state)
    energy = energy_counter()
    for gpu in range(args.gpus):
        row = gpu_row(rows, call + gpu, gpu, energy)
        cells = []
        for field in fields:
            if field in args.na:
                cells.append("[N/A]")
            elif field in args.not_supported:
                cells.append("[Not Supported]")
            else:
                cells.append(value(row[ALIASES.get(field, field)], "nounits" not in formats))
        print(", ".join(cells))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--query-gpu", required=True, help="fields, comma-separated, as nvidia-smi")
    p.add_argument("--format", required=True, help="csv[,noheader][,nounits], as nvidia-smi")
    p.add_argument("--recording", default="load", help="load, idle, or a CSV file's path")
    p.add_argument("--gpus", type=int, default=1, help="GPUs presented (default 1)")
    p.add_argument("--state", type=Path, help="call counter file: one recorded row per call")
    p.add_argument("--na", action="append", default=[], help="a field answered [N/A]")
    p.add_argument("--not-supported", action="append", default=[], help="... [Not Supported]")
    p.add_argument("--no-energy", action="store_true", help=f"{ENERGY_FIELD} is unknown")
    p.add_argument("--fail", type=int, default=0, help="exit with this status, nothing answered")
    p.add_argument("--fail-message", default="", help="what a failing run prints on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.fail:
        print(args.fail_message, file=sys.stderr)
        return args.fail
    return answer(args)


if __name__ == "__main__":
    sys.exit(main())
