"""One client's live stream of a job, as Server-Sent Events.

    event: readings   data: [reading, ...]   (Kwollect's shape, oldest first)
    event: live       data: {"replayed": n}  (the replay is over: what follows is live)
    event: end        data: {"job_id", "end"} (the job ended; its last readings were sent)
    event: dropped    data: {"error"}         (the client did not keep up)
    event: error      data: {"error"}         (the stream cannot go on)
    : keepalive                               (a comment, when nothing else was sent)

From now, or from `since` with no gap and no duplicate at the switch: the stream first
subscribes to the hub (every message from offsets P on reaches it), then waits until
ClickHouse has ingested every message before P, then replays from ClickHouse, noting per
series the newest time replayed (`Seam`). Messages from P on that ClickHouse had also
ingested by then hold readings the replay sent: within a series (one device, one
partition, in order) they are exactly those not newer than the series' newest replayed
time, so they are left out, and everything else is sent live.

The stream ends `live_end_grace_s` after the job's end, once readings up to the end had
time to arrive. The job is re-read every `live_job_check_s` (for its end, its nodes and the
devices measuring them); from then on no reading after its end is sent. Readings sent
before the API learned of the end (a scheduler reports it after the fact) are not recalled:
the `end` event gives the end, to cut them. A job its caller no longer sees (its user or
project changed: api/visibility.py) ends the stream with `error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from api import formats
from api.infra.config import ApiSettings
from api.infra.errors import NotFound
from api.infra.kafka import KafkaUnavailable
from api.infra.params import to_time, to_us
from api.jobs import get_job
from api.live.hub import ReadingsHub, Subscription
from api.live.ingested import IngestWatch
from api.live.scope import LiveScope, Seam, glob_regex
from api.live.sse import KEEPALIVE, event, json_lines_event
from api.queries.jobs import ALL_JOBS, Condition
from api.queries.metrics import Selection, readings_stream, scope_rows
from api.schemas import Job
from api.scope import Asked, job_selection, now, with_aliases

log = logging.getLogger("jobscope.api.live")
_REPLAY_EVENT_ROWS = 5000


@dataclass(frozen=True)
class LiveRequest:
    job_id: str
    asked: Asked
    """metrics, labels, devices (`only`), and `start` = since (None: from now)."""
    visible: Condition = ALL_JOBS
    """The jobs its caller sees (api/visibility.py): re-checked with the job."""


class JobStream:
    def __init__(
        self,
        request: LiveRequest,
        clickhouse: Client,
        hub: ReadingsHub,
        ingested: IngestWatch,
        settings: ApiSettings,
    ) -> None:
        self.request = request
        self.clickhouse = clickhouse
        self.hub = hub
        self.ingested = ingested
        self.settings = settings
        self.scope = LiveScope(frozenset(), 0, None, glob_regex(request.asked.metrics))
        self.scope.labels = request.asked.labels
        self.scope.only = frozenset(request.asked.devices)
        self.seam: Seam | None = None
        self.job: Job | None = None
        self.selection: Selection | None = None
        """The job's scope as a readings query (the replay's), newest version."""

    async def open(self, job: Job) -> Subscription:
        """Resolve the job's scope and subscribe to its devices' messages; the caller
        unsubscribes once the response is over."""
        self.job = job
        await asyncio.to_thread(self._follow, job)
        sub = Subscription(
            self.scope.keys, asyncio.get_running_loop(), self.settings.live_buffer_bytes
        )
        try:
            await asyncio.to_thread(self.hub.subscribe, sub)
        except Exception as exc:  # the client library's errors, a topic missing
            raise KafkaUnavailable(f"Kafka at {self.hub.bootstrap}: {exc}") from exc
        return sub

    async def events(self, sub: Subscription) -> AsyncIterator[bytes]:
        """The whole stream, from the subscription `open` made."""
        try:
            replayed = 0
            if self.request.asked.start is not None:
                async for chunk, count in self._replay(sub):
                    replayed += count
                    yield chunk
            yield event("live", {"replayed": replayed})
            async for chunk in self._live(sub):
                yield chunk
        except StreamError as exc:
            log.warning("live: job %s: %s", self.request.job_id, exc)
            yield event("error", {"error": str(exc)})

    def _follow(self, job: Job) -> None:
        """Bring the scope up to the job's newest version and the devices now seen measuring
        its nodes (blocking)."""
        self.selection = with_aliases(self.clickhouse, self._selection(job))
        chosen = self.selection
        self.scope.nodes = frozenset(chosen.devices) if chosen else frozenset()
        self.scope.start_us = to_us(chosen.start) if chosen else 0
        self.scope.end_us = to_us(to_time(job.end)) if job.end else None
        self.scope.aliased = frozenset(chosen.aliased) if chosen else frozenset()
        self.scope.allocated = chosen.allocated if chosen else None

    def _selection(self, job: Job) -> Selection | None:
        """The job's scope from `since` on: to its end, or while it runs to a day ahead
        (pushed readings may be ahead of now; the seam sorts out what comes live)."""
        since = self.request.asked.start
        selection = job_selection(job, replace(self.request.asked, start=None))
        if selection is None:
            return None
        if job.end is None:
            selection = replace(selection, end=now() + timedelta(days=1))
        if since is not None and since > selection.start:
            selection = replace(selection, start=since)
        return selection

    async def _replay(self, sub: Subscription) -> AsyncIterator[tuple[bytes, int]]:
        missing = await asyncio.to_thread(
            self.ingested.wait, sub.positions, self.settings.live_seam_timeout_s
        )
        if missing:
            raise StreamError(
                f"ClickHouse is {missing} messages behind Kafka after "
                f"{self.settings.live_seam_timeout_s:.0f} s: cannot replay without a gap"
            )
        self.seam = Seam()
        selection = self.selection
        if selection is None:
            return
        params: dict[str, Any] = {}
        rows, ndjson = scope_rows(selection, params), formats.FORMATS["ndjson"]
        raw = await asyncio.to_thread(
            readings_stream,
            self.clickhouse,
            rows,
            params,
            ndjson.timestamp,
            ndjson.labels,
            ndjson.clickhouse,
        )
        blocks = formats.blocks(raw)
        carry = b""
        lines: list[bytes] = []
        try:
            while (block := await asyncio.to_thread(next, blocks, None)) is not None:
                *complete, carry = (carry + block).split(b"\n")
                lines.extend(line for line in complete if line)
                if len(lines) >= _REPLAY_EVENT_ROWS:
                    yield self._replayed(lines), len(lines)
                    lines = []
        finally:
            raw.close()
        if carry.strip():
            lines.append(carry)
        if lines:
            yield self._replayed(lines), len(lines)

    def _replayed(self, lines: list[bytes]) -> bytes:
        assert self.seam is not None
        self.seam.note(orjson.loads(line) for line in lines)
        return json_lines_event("readings", lines)

    async def _live(self, sub: Subscription) -> AsyncIterator[bytes]:
        settings = self.settings
        sent_at = time.monotonic()
        next_check = time.monotonic()
        if self.scope.end_us is None:
            next_check += settings.live_job_check_s
        while True:
            wait = min(next_check, sent_at + settings.live_heartbeat_s) - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sub.wake.wait(), max(wait, 0.0))
            if sub.overflowed:
                log.warning(
                    "live: job %s: a client was dropped: it took less than its readings",
                    self.request.job_id,
                )
                yield event("dropped", {"error": "the client did not keep up with its readings"})
                return
            if rows := self.scope.rows(sub.take(), self.seam):
                yield event("readings", rows)
                sent_at = time.monotonic()
                await asyncio.sleep(settings.live_flush_s)  # let the next event gather more
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + settings.live_job_check_s
                if await self._job_check(sub):
                    if rows := self.scope.rows(sub.take(), self.seam):
                        yield event("readings", rows)
                    assert self.job is not None
                    yield event("end", {"job_id": self.job.job_id, "end": self.job.end})
                    return
            if time.monotonic() - sent_at >= settings.live_heartbeat_s:
                yield KEEPALIVE
                sent_at = time.monotonic()

    async def _job_check(self, sub: Subscription) -> bool:
        """Follow the job's changes; True once it has ended and its grace has passed."""
        try:
            job = await asyncio.to_thread(
                get_job, self.clickhouse, self.request.job_id, None, self.request.visible
            )
            await asyncio.to_thread(self._follow, job)
        except NotFound:
            raise StreamError(
                f"job {self.request.job_id} is no longer visible to you (its user or project "
                "changed)"
            ) from None
        except Exception as exc:  # ClickHouse away: keep streaming what Kafka brings
            log.warning("live: job %s: cannot refresh the job: %s", self.request.job_id, exc)
            return False
        self.job = job
        if sub.keys != self.scope.keys:
            await asyncio.to_thread(self.hub.update, sub, self.scope.keys)
        if self.scope.end_us is None:
            return False
        grace_us = int(self.settings.live_end_grace_s * 1e6)
        return to_us(now()) >= self.scope.end_us + grace_us


class StreamError(RuntimeError):
    """The stream cannot go on; sent to the client as an `error` event."""
