"""`prometheus://`: Prometheus exporters (node_exporter...), Kwollect's URL form and more.

One instance per scrape URL (and period): every entry naming that URL shares one scrape per
tick, over one kept-alive HTTP connection, and picks its samples from it.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode, urlsplit

import httpx
from pydantic import Field, model_validator

from kafka.reading import Reading
from producers.plugins.base import OneRequestPlugin, validated
from producers.plugins.prometheus.exposition import (
    ExpositionError,
    Sample,
    parse_openmetrics,
    parse_text,
)
from producers.plugins.prometheus.selection import Selection, SelectOptions, query_options

if TYPE_CHECKING:
    from producers.entry import DeviceEntry

DEFAULT_PATH = "/metrics"
ACCEPT = "text/plain;version=0.0.4;q=1.0,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
"""The text format first: its sample names are Kwollect's (OpenMetrics renames counters)."""
_SHOWN_BYTES = 200


class ScrapeOptions(SelectOptions):
    """A `prometheus://` URL's query string: the selection (shared with `file://`), plus how
    to scrape: `timeout_s=` and `param.NAME=VALUE` (HTTP query parameters of the scrape)."""

    timeout_s: float = Field(10.0, gt=0, le=300, description="one scrape, at most")
    params: tuple[tuple[str, str], ...] = Field(
        (), description="param.NAME=VALUE: sent with the scrape (snmp_exporter's target...)"
    )

    @model_validator(mode="before")
    @classmethod
    def _params(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        params = tuple(
            (key.removeprefix("param."), value)
            for key, value in data.items()
            if key.startswith("param.")
        )
        rest = {key: value for key, value in data.items() if not key.startswith("param.")}
        return {**rest, "params": params} if params else rest


@dataclass(frozen=True)
class Target:
    """What one scrape asks: entries with equal targets (and periods) share it."""

    url: str
    """The HTTP URL scraped, parameters included."""
    timeout_s: float


def parse(entry: DeviceEntry) -> tuple[Target, ScrapeOptions]:
    """The target and options of a `prometheus://` entry; ValueError naming what is wrong.

    Kwollect's form has no query string: `prometheus://host:port/[name1-name2...]` scrapes
    /metrics and keeps the listed samples (all without a list). With a query string, the
    path is the HTTP path scraped (/metrics when empty) and the query holds the options.
    """
    parts = urlsplit(entry.url)
    if parts.fragment or parts.username is not None:
        raise ValueError("prometheus:// takes no #fragment and no user or password")
    if not parts.hostname:
        raise ValueError("prometheus:// needs a host: prometheus://host:port/...")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port: {exc}") from None
    if port is None:
        raise ValueError("prometheus:// needs the exporter's port (node_exporter: 9100)")
    if parts.query:
        options = query_options(entry.url, ScrapeOptions)
        path = parts.path if parts.path not in ("", "/") else DEFAULT_PATH
    else:  # Kwollect's form
        names = unquote(parts.path).strip("/")
        if names == DEFAULT_PATH.strip("/"):
            raise ValueError(
                "without a ?query the path lists sample names (Kwollect's form) and /metrics "
                f"is scraped anyway: write prometheus://{parts.netloc}/ for every sample"
            )
        options = validated({"metrics": names.replace("-", ",")} if names else {}, ScrapeOptions)
        path = DEFAULT_PATH
    url = f"http://{parts.netloc}{path}"
    if options.params:
        url += "?" + urlencode(options.params)
    return Target(url, options.timeout_s), options


class PrometheusPlugin(OneRequestPlugin):
    scheme = "prometheus"

    def __init__(self, entries: Sequence[DeviceEntry], target: Target) -> None:
        self.entries = tuple(entries)
        self.target = target
        self.selections = [Selection(entry, parse(entry)[1], target.url) for entry in entries]
        self._client: httpx.AsyncClient | None = None
        self.scrapes = 0
        """Scrapes so far (tests check one per poll)."""

    @classmethod
    def parse(cls, entry: DeviceEntry) -> tuple[Hashable, object]:
        """(the scrape target, the entry's selection): one scrape per poll."""
        return parse(entry)

    async def poll(self, timestamp_us: int) -> list[Reading]:
        samples = await self.scrape()
        readings: list[Reading] = []
        for selection in self.selections:
            readings += selection.readings(samples, timestamp_us, self.skips)
        return readings

    async def scrape(self) -> list[Sample]:
        """One GET of the target, parsed; RuntimeError saying why when nothing came back."""
        if self._client is None:
            logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per scrape
            self._client = httpx.AsyncClient(
                headers={"Accept": ACCEPT, "User-Agent": "jobscope-producer"},
                timeout=self.target.timeout_s,
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                follow_redirects=True,
                trust_env=False,  # no proxy from the environment: scrape the target itself
            )
        self.scrapes += 1
        url = self.target.url
        try:
            response = await self._client.get(url)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"scrape of {url} failed: {type(exc).__name__}: {exc}") from None
        body = response.content
        if response.status_code != 200:
            raise RuntimeError(
                f"scrape of {url}: HTTP {response.status_code}: {body[:_SHOWN_BYTES]!r}"
            )
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in ("text/plain", "", "application/openmetrics-text"):
            raise RuntimeError(
                f"scrape of {url}: not a Prometheus exposition (Content-Type {kind}; is the "
                "path right?)"
            )
        text = body.decode("utf-8", errors="replace")
        try:
            if kind == "application/openmetrics-text":
                return parse_openmetrics(text)
            return parse_text(text)
        except ExpositionError as exc:
            raise RuntimeError(f"scrape of {url}: {exc}") from None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
