"""The producers' disk spool: messages Kafka could not take yet, kept in order on disk.

One directory per producer process, locked while the process runs (`spool.lock`). It holds
segment files, each a file header followed by records:

    file header   8 bytes: b"JSSPOOL1"
    record        magic b"\\xd5SPR", body length (u32 LE), CRC-32 of (length, body) (u32 LE),
                  body: readings (u32 LE), key length (u16 LE), key (UTF-8), message payload

Segments are named `<major>-<minor>.seg` and read in (major, minor) order. Appends go to
the newest segment (`<major>-0.seg`, a new major when it reaches `segment_bytes`);
`insert_after(major, ...)` writes `<major>-<minor>.seg` with the next free minor, which
sorts after segment `major` and before `major + 1`: at shutdown, the publisher puts there
the messages it had handed to Kafka between those two segments, so that order holds.

A record leaves the spool when it is acknowledged: a segment is deleted once it is complete
(sealed) and all its records are acknowledged. Until then, which records are acknowledged
is written beside it (`<segment>.acked`, at `checkpoint()` and `close()`), so that a restart
sends only the others. Records acknowledged after the last checkpoint of a crashed process
are sent again (a duplicate, hidden from readers by ClickHouse's FINAL).

At open, every segment is read and checked: a record whose checksum, length or magic is
wrong (a crash in the middle of a write, a damaged disk) is reported with its file and
offset, counted in `corrupt_bytes`, and skipped up to the next record that checks out.

Segments are written through a buffer flushed after each `append` (a killed process loses
nothing that `append` returned) and fsync'ed when sealed and at `close` (an operating system
crash may lose the unsynced tail: it is then reported as truncated at the next start).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import struct
import zlib
from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

log = logging.getLogger(__name__)

FILE_MAGIC = b"JSSPOOL1"
RECORD_MAGIC = b"\xd5SPR"
_HEADER = struct.Struct("<4sII")  # magic, body length, CRC-32 of (length, body)
_LENGTH = struct.Struct("<I")
_BODY_HEAD = struct.Struct("<IH")  # readings, key length
MAX_RECORD_BYTES = 64 << 20
"""A longer length field can only be damage (Kafka's own limit is far lower)."""
_SEGMENT_NAME = re.compile(r"^(\d+)-(\d+)\.seg$")
_READ_AHEAD = 1000


class SpoolError(RuntimeError):
    """The spool cannot be used (its directory cannot be created, or another process has it)."""


class SpoolRecord(NamedTuple):
    """One Kafka message: its key (the device), body, and how many readings it carries."""

    key: str
    payload: bytes
    readings: int


def encode(record: SpoolRecord) -> bytes:
    """The bytes of one record, header included."""
    key = record.key.encode()
    body = _BODY_HEAD.pack(record.readings, len(key)) + key + record.payload
    length = _LENGTH.pack(len(body))
    return RECORD_MAGIC + length + _LENGTH.pack(zlib.crc32(body, zlib.crc32(length))) + body


def _decode_body(body: bytes) -> SpoolRecord:
    readings, key_length = _BODY_HEAD.unpack_from(body)
    start = _BODY_HEAD.size
    key = body[start : start + key_length].decode()
    return SpoolRecord(key, body[start + key_length :], readings)


def _record_end(data: bytes, pos: int) -> int | None:
    """Where the record starting at `pos` ends, if it is sound; else None."""
    if pos + _HEADER.size > len(data):
        return None
    magic, length, crc = _HEADER.unpack_from(data, pos)
    end = pos + _HEADER.size + length
    if magic != RECORD_MAGIC or length > MAX_RECORD_BYTES or end > len(data):
        return None
    body = memoryview(data)[pos + _HEADER.size : end]
    if zlib.crc32(body, zlib.crc32(data[pos + 4 : pos + 8])) != crc or length < _BODY_HEAD.size:
        return None
    _readings, key_length = _BODY_HEAD.unpack_from(body)
    if _BODY_HEAD.size + key_length > length:
        return None
    return end


@dataclass
class Segment:
    """One segment file and what is known of its records."""

    path: Path
    major: int
    minor: int
    offsets: array
    """Where each sound record starts; a record's index is its position here."""
    size: int
    sealed: bool
    acked_prefix: int = 0
    """Records 0..acked_prefix-1 are acknowledged..."""
    acked_extra: set[int] | None = None
    """...and these ones after it (acknowledgements arrive out of order across partitions)."""
    next_read: int = 0
    dirty: bool = False
    """Acknowledgements not written to the sidecar yet."""

    @property
    def acked(self) -> int:
        return self.acked_prefix + len(self.acked_extra or ())

    @property
    def sidecar(self) -> Path:
        return self.path.with_suffix(".acked")

    def is_acked(self, index: int) -> bool:
        return index < self.acked_prefix or index in (self.acked_extra or ())

    def ack(self, index: int) -> None:
        self.dirty = True
        if index != self.acked_prefix:
            if self.acked_extra is None:
                self.acked_extra = set()
            self.acked_extra.add(index)
            return
        self.acked_prefix += 1
        extra = self.acked_extra
        while extra and self.acked_prefix in extra:
            extra.discard(self.acked_prefix)
            self.acked_prefix += 1

    @property
    def done(self) -> bool:
        return self.sealed and self.acked >= len(self.offsets)


class SpoolItem(NamedTuple):
    """A record handed out by `peek`, to be acknowledged with `ack(item)`."""

    segment: Segment
    index: int
    record: SpoolRecord


class Spool:
    """An append-only, segmented, checksummed, size-bounded FIFO of Kafka messages on disk.

    Not thread-safe: one thread (the producers' event loop) uses it.
    """

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.corrupt_bytes = 0
        """Bytes found unreadable at open (corrupt or truncated records), skipped."""
        self._lock = self._take_lock()
        self._segments: list[Segment] = []
        self._active: Segment | None = None
        self._writer: BinaryIO | None = None
        self._reader: tuple[Segment, BinaryIO] | None = None
        self._ahead: deque[SpoolItem] = deque()
        self.bytes = 0
        self.messages = 0
        """Records not yet acknowledged."""
        self.unread = 0
        """Records not handed out by `peek`/`consume` yet."""
        for segment in self._open_segments():
            self._add(segment)
        self.recovered_messages = self.messages
        self.last_major = max((s.major for s in self._segments), default=0)
        """The newest segment's major (0 while there has been none)."""

    # -- opening ------------------------------------------------------------------------

    def _take_lock(self) -> int:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / "spool.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(f"cannot use the spool directory {self.directory}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise SpoolError(
                f"the spool directory {self.directory} is in use by another producer process "
                f"(pid {owner or 'unknown'}); give each process its own (JOBSCOPE_SPOOL_DIR)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _open_segments(self) -> Iterable[Segment]:
        names = []
        for path in self.directory.iterdir():
            if match := _SEGMENT_NAME.match(path.name):
                names.append((int(match[1]), int(match[2]), path))
            elif path.suffix == ".tmp":
                path.unlink(missing_ok=True)  # a sidecar write cut short
        for major, minor, path in sorted(names):
            try:
                segment = self._scan(path, major, minor)
            except OSError as exc:
                log.error("spool %s: cannot be read (%s): left aside", path, exc)
                continue
            self._load_sidecar(segment)
            if segment.done:
                self._delete(segment)
            else:
                yield segment
        for path in self.directory.glob("*.acked"):
            if not path.with_suffix(".seg").exists():
                path.unlink(missing_ok=True)

    def _scan(self, path: Path, major: int, minor: int) -> Segment:
        """Read a segment of an earlier run: where its sound records are; report the rest."""
        data = path.read_bytes()
        offsets = array("Q")
        bad: list[tuple[int, int]] = []
        bad_from: int | None = None
        pos = len(FILE_MAGIC) if data.startswith(FILE_MAGIC) else 0
        while pos < len(data):
            end = _record_end(data, pos)
            if end is None:
                if bad_from is None:
                    bad_from = pos
                pos = data.find(RECORD_MAGIC, pos + 1)
                if pos < 0:
                    pos = len(data)
                continue
            if bad_from is not None:
                bad.append((bad_from, pos - bad_from))
                bad_from = None
            offsets.append(pos)
            pos = end
        if bad_from is not None:
            bad.append((bad_from, len(data) - bad_from))
        if bad:
            skipped = sum(n for _, n in bad)
            self.corrupt_bytes += skipped
            log.warning(
                "spool %s: %d bytes unreadable (corrupt or truncated records, e.g. written "
                "when a process or machine crashed) at offsets %s; skipped, %d sound records "
                "kept",
                path,
                skipped,
                ", ".join(f"{at} ({n} bytes)" for at, n in bad[:5])
                + (" ..." if len(bad) > 5 else ""),
                len(offsets),
            )
        return Segment(path, major, minor, offsets, len(data), sealed=True)

    def _load_sidecar(self, segment: Segment) -> None:
        try:
            state = json.loads(segment.sidecar.read_text())
            records = len(segment.offsets)
            segment.acked_prefix = min(int(state["prefix"]), records)
            extra = {int(i) for i in state["extra"]}
            segment.acked_extra = {i for i in extra if segment.acked_prefix < i < records} or None
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "spool %s: unreadable (%s): all records of %s are sent again",
                segment.sidecar,
                exc,
                segment.path.name,
            )
            segment.acked_prefix, segment.acked_extra = 0, None
        segment.next_read = segment.acked_prefix

    def _add(self, segment: Segment) -> None:
        self._segments.append(segment)
        self.bytes += segment.size
        pending = len(segment.offsets) - segment.acked
        self.messages += pending
        self.unread += pending

    # -- writing ------------------------------------------------------------------------

    def append(self, records: Sequence[SpoolRecord]) -> int:
        """Write `records` at the end, in order, until one does not fit in `max_bytes` (or
        the disk fails); return how many were written."""
        written = 0
        try:
            for record in records:
                data = encode(record)
                segment = self._active
                if segment is None or (
                    segment.size + len(data) > self.segment_bytes and segment.offsets
                ):
                    if self.bytes + len(FILE_MAGIC) + len(data) > self.max_bytes:
                        break
                    segment = self._new_segment(self.last_major + 1, 0)
                elif self.bytes + len(data) > self.max_bytes:
                    break
                self._write(segment, data)
                written += 1
            if self._writer is not None:
                self._writer.flush()
        except OSError as exc:
            return written - self._undo_unflushed(exc)
        return written

    def insert_after(self, major: int, records: Sequence[SpoolRecord]) -> int:
        """Write `records` into a new segment read after segment `major` and before
        `major + 1` (for shutdown: reading must not go on afterwards); return how many fit."""
        self._seal()
        minor = 1 + max((s.minor for s in self._segments if s.major == major), default=0)
        written = 0
        try:
            segment = None
            for record in records:
                data = encode(record)
                extra = len(data) + (0 if segment else len(FILE_MAGIC))
                if self.bytes + extra > self.max_bytes:
                    break
                if segment is None:
                    segment = self._new_segment(major, minor)
                self._write(segment, data)
                written += 1
            self._seal()
        except OSError as exc:
            return written - self._undo_unflushed(exc)
        self._segments.sort(key=lambda s: (s.major, s.minor))
        return written

    def _new_segment(self, major: int, minor: int) -> Segment:
        self._seal()
        path = self.directory / f"{major:012d}-{minor:04d}.seg"
        self._writer = open(path, "wb")  # noqa: SIM115 (kept open while the segment grows)
        self._writer.write(FILE_MAGIC)
        segment = Segment(path, major, minor, array("Q"), len(FILE_MAGIC), sealed=False)
        self._active = segment
        self._add(segment)
        self.last_major = max(self.last_major, major)
        return segment

    def _write(self, segment: Segment, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)
        segment.offsets.append(segment.size)
        segment.size += len(data)
        self.bytes += len(data)
        self.messages += 1
        self.unread += 1

    def _undo_unflushed(self, exc: OSError) -> int:
        """After a failed write: forget the records of the segment being written that did
        not reach its file, and seal it; return how many were forgotten. (A record cut in
        the middle stays in the file, for the next start's scan to report.)"""
        segment, writer = self._active, self._writer
        log.error("spool %s: write failed: %s", segment.path if segment else self.directory, exc)
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
        self._writer = self._active = None
        if segment is None:
            return 0
        try:
            on_disk = segment.path.stat().st_size
        except OSError:
            on_disk = 0
        lost = 0
        written = segment.size
        while segment.offsets and segment.size > on_disk:
            segment.size = segment.offsets.pop()
            lost += 1
        self.bytes += on_disk - written
        segment.size = on_disk
        self.messages -= lost
        self.unread -= lost
        segment.sealed = True
        return lost

    def _seal(self) -> None:
        """Close the segment being written: nothing is appended to it any more."""
        if self._writer is not None:
            try:
                self._writer.flush()
                os.fsync(self._writer.fileno())
                self._writer.close()
            except OSError as exc:  # what did not reach the disk fails when read, and is skipped
                log.error("spool %s: cannot close: %s", self._active and self._active.path, exc)
            self._writer = None
        if self._active is not None:
            self._active.sealed = True
            segment, self._active = self._active, None
            if segment.done:
                self._delete(segment)

    # -- reading ------------------------------------------------------------------------

    def peek(self, limit: int) -> list[SpoolItem]:
        """Up to `limit` of the oldest records not handed out yet, without handing them out."""
        while len(self._ahead) < min(limit, self.unread):
            self._read_more(max(limit, _READ_AHEAD) - len(self._ahead))
        return [self._ahead[i] for i in range(min(limit, len(self._ahead)))]

    def consume(self, count: int) -> None:
        """Hand out the first `count` records `peek` returned (they now await `ack`)."""
        for _ in range(count):
            self._ahead.popleft()
        self.unread -= count
        if self.unread == 0 and self._active is not None:
            self._seal()  # caught up with the writer: the segment can go once acknowledged

    def _read_more(self, count: int) -> None:
        for segment in self._segments:
            if segment.next_read < len(segment.offsets):
                break
        else:
            raise AssertionError("unread records but none left to read")
        handle = self._open_reader(segment)
        while count > 0 and segment.next_read < len(segment.offsets):
            index = segment.next_read
            segment.next_read += 1
            if segment.is_acked(index):
                continue
            handle.seek(segment.offsets[index])
            try:
                record = self._read_record(handle)
            except (OSError, ValueError, struct.error) as exc:
                log.error("spool %s: record %d unreadable (%s): skipped", segment.path, index, exc)
                self.unread -= 1
                self._ack(segment, index)
                continue
            self._ahead.append(SpoolItem(segment, index, record))
            count -= 1

    def _open_reader(self, segment: Segment) -> BinaryIO:
        if self._reader is not None and self._reader[0] is segment:
            return self._reader[1]
        self._close_reader()
        handle = open(segment.path, "rb")  # noqa: SIM115 (kept open while the segment is read)
        self._reader = (segment, handle)
        return handle

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader[1].close()
            self._reader = None

    @staticmethod
    def _read_record(handle: BinaryIO) -> SpoolRecord:
        magic, length, _crc = _HEADER.unpack(handle.read(_HEADER.size))
        body = handle.read(length)
        if magic != RECORD_MAGIC or len(body) != length:
            raise ValueError("short or misplaced record")
        return _decode_body(body)

    # -- acknowledging ------------------------------------------------------------------

    def ack(self, item: SpoolItem) -> None:
        """The record was delivered (or failed for good): it leaves the spool."""
        self._ack(item.segment, item.index)

    def _ack(self, segment: Segment, index: int) -> None:
        segment.ack(index)
        self.messages -= 1
        if segment.done and segment in self._segments:
            self._delete(segment)

    def _delete(self, segment: Segment) -> None:
        if self._reader is not None and self._reader[0] is segment:
            self._close_reader()
        segment.path.unlink(missing_ok=True)
        segment.sidecar.unlink(missing_ok=True)
        if segment in self._segments:
            self._segments.remove(segment)
            self.bytes -= segment.size
            self.messages -= len(segment.offsets) - segment.acked

    def checkpoint(self) -> None:
        """Write which records of each segment are acknowledged, for a restart after a crash."""
        for segment in self._segments:
            if segment.dirty:
                segment.dirty = False
                tmp = segment.sidecar.with_suffix(".tmp")
                state = {"prefix": segment.acked_prefix, "extra": sorted(segment.acked_extra or ())}
                try:
                    tmp.write_text(json.dumps(state))
                    tmp.replace(segment.sidecar)
                except OSError as exc:
                    log.error("spool %s: cannot write: %s", segment.sidecar, exc)

    # -- state --------------------------------------------------------------------------

    @property
    def segments(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        """Seal, checkpoint and unlock; an empty spool's directory is removed (while still
        locked, so no other process can have taken it). The spool is not used afterwards."""
        self._seal()
        self._close_reader()
        self.checkpoint()
        if not self._segments:
            with contextlib.suppress(OSError):
                (self.directory / "spool.lock").unlink()
                self.directory.rmdir()
        with contextlib.suppress(OSError):
            dir_fd = os.open(self.directory, os.O_RDONLY)
            os.fsync(dir_fd)
            os.close(dir_fd)
        os.close(self._lock)
