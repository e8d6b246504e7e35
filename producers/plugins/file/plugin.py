"""`file://`: values experimenters push as Prometheus textfiles (node_exporter's textfile
collector format, `kwollect_custom` lines included), read by the producer itself.

One instance per path (and period): at every tick it reads the folder's `*.prom` files (or
the one file the URL names) in a worker thread, and each entry picks its samples from them
with the same options and naming as `prometheus://` (selection.py). A malformed file is left
out (logged once, counted as skipped), the others are read.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from kafka.reading import Reading
from producers.plugins.base import OneRequestPlugin
from producers.plugins.prometheus.exposition import ExpositionError, Sample, parse_text
from producers.plugins.prometheus.selection import Selection, SelectOptions, query_options

if TYPE_CHECKING:
    from producers.entry import DeviceEntry

PATTERN = "*.prom"
"""The files of a folder that are read, as node_exporter's textfile collector."""
MAX_FILE_BYTES = 4 * 1024 * 1024
"""A larger file is skipped (reported): it would hold up the producer at every tick."""


def parse(entry: DeviceEntry) -> tuple[Path, SelectOptions]:
    """The path and options of a `file://` entry; ValueError naming what is wrong."""
    parts = urlsplit(entry.url)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise ValueError(
            "file:// takes an absolute path on the producer's machine: file:///var/lib/textfiles"
        )
    if parts.fragment:
        raise ValueError("file:// takes no #fragment")
    return Path(os.path.normpath(unquote(parts.path))), query_options(entry.url, SelectOptions)


def read_samples(path: Path) -> tuple[list[Sample], list[tuple[Path, str]]]:
    """The samples of `path` (a file, or a folder's `*.prom` files in name order) and the
    files left out with the reason. OSError when `path` cannot be read at all."""
    if not path.is_dir():
        return _read(path, missing_ok=False)
    samples: list[Sample] = []
    skipped: list[tuple[Path, str]] = []
    for file in sorted(path.glob(PATTERN)):
        if file.is_file():
            got, bad = _read(file, missing_ok=True)
            samples += got
            skipped += bad
    return samples, skipped


def _read(file: Path, missing_ok: bool) -> tuple[list[Sample], list[tuple[Path, str]]]:
    try:
        with open(file, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        if missing_ok:  # renamed or deleted since the folder was listed: gone, not broken
            return [], []
        raise
    except OSError as exc:
        if not missing_ok:
            raise
        return [], [(file, f"cannot be read: {exc.strerror or exc}")]
    if len(data) > MAX_FILE_BYTES:
        return [], [(file, f"larger than {MAX_FILE_BYTES} bytes")]
    try:
        return parse_text(data.decode("utf-8")), []
    except UnicodeDecodeError as exc:
        return [], [(file, f"not UTF-8 text (byte {exc.start})")]
    except ExpositionError as exc:
        return [], [(file, f"malformed: {exc}")]


class FilePlugin(OneRequestPlugin):
    scheme = "file"

    def __init__(self, entries: Sequence[DeviceEntry], path: Path) -> None:
        self.entries = tuple(entries)
        self.path = path
        self.selections = [Selection(entry, parse(entry)[1], str(path)) for entry in entries]

    @classmethod
    def parse(cls, entry: DeviceEntry) -> tuple[Hashable, object]:
        """(the folder or file, the entry's selection): its files are read once per poll."""
        return parse(entry)

    async def poll(self, timestamp_us: int) -> list[Reading]:
        try:
            samples, skipped = await asyncio.to_thread(read_samples, self.path)
        except OSError as exc:
            raise RuntimeError(f"{self.path}: {exc.strerror or exc}") from None
        for file, reason in skipped:
            self.skips.skip(self.entries[0].device_id, f"file {file}", reason)
        readings: list[Reading] = []
        for selection in self.selections:
            readings += selection.readings(samples, timestamp_us, self.skips)
        return readings
