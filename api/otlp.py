"""OpenTelemetry's OTLP/HTTP metrics (`POST /v1/metrics`, also `POST /api/v1/otlp/v1/metrics`,
Prometheus' path): an `ExportMetricsServiceRequest` as protobuf (`application/x-protobuf`) or
in OTLP's JSON mapping (`application/json`: camelCase names, int64 as strings or numbers,
enums as integers), gzip or not, turned into the readings of a push (api/push.py). JSON is
parsed into the same message as protobuf, so both take one mapping.

Names as Prometheus' own OTLP receiver writes them (its default, UnderscoreEscapingWithSuffixes;
the Collector's prometheusremotewrite exporter does the same), so that a metric reads the same
sent here or remote-written to /api/v1/write:
- the metric name split on every character outside `[a-zA-Z0-9:]`, joined by `_`; the unit's
  Prometheus word appended unless already a part (`W` -> `_watts`, `By` -> `_bytes`, `s` ->
  `_seconds`, `By/s` -> `_bytes_per_second`; `{...}` annotations and `1` add nothing), `_total`
  for a monotonic sum, `_ratio` for a gauge of unit `1`; a leading digit gets a `_`;
- attribute keys: characters outside `[a-zA-Z0-9_]` as `_`, runs of `_` as one, a leading
  digit after `key_`; values as text (booleans `true`/`false`, arrays and maps as JSON, bytes
  as base64).

A resource's `host.name` (else `service.instance.id`) names the device through
api/push_devices.py, as remote_write's `instance`/`host` do; its other attributes are not
stored (Prometheus makes them `target_info`). A data point's attributes are its labels,
checked as a push's (none starting with `_`). Gauges and cumulative sums (monotonic or not,
int or double) are readings, at `timeUnixNano` truncated to the microsecond. Delta sums,
histograms, exponential histograms and summaries are not stored: skipped, counted, and
reported in the answer's `partialSuccess`, as are NaN and infinite values and points flagged
"no recorded value". A request naming no device, or with an unusable name, label or time, is a
400 naming it: nothing of it is kept.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import Response

from api import push
from api.infra.config import ApiSettings
from api.infra.errors import Forbidden, ParameterError, TooLarge
from api.infra.kafka import KafkaUnavailable
from api.infra.tokens import Principal
from api.push_devices import PushDevices
from kafka.reading import Reading

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
DEVICE_ATTRIBUTES = ("host.name", "service.instance.id")
"""The resource attributes naming the sender's machine, the first one present wins."""
SKIPPED = ("non_finite", "no_value", "delta", "histograms", "summaries")
"""What a request may carry that is not stored: NaN and infinite values, points without a
value (flagged "no recorded value", or none set), delta (or unspecified) sums, histograms and
exponential histograms, summaries."""
_WHY = {
    "non_finite": "NaN or infinite",
    "no_value": "with no recorded value",
    "delta": "of delta sums (jobscope stores gauges and cumulative sums)",
    "histograms": "of histograms",
    "summaries": "of summaries",
}
UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
"""UCUM units and the words Prometheus' translation appends for them (others as written)."""
PER_UNITS = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}
"""... and for the unit after `/` (`By/s` -> `bytes_per_second`)."""
GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 413: 8, 415: 12, 429: 8, 503: 14}
"""google.rpc.Code of each answer: INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED,
NOT_FOUND, RESOURCE_EXHAUSTED, UNIMPLEMENTED, RESOURCE_EXHAUSTED, UNAVAILABLE."""
_NOT_NAME = re.compile(r"[^a-zA-Z0-9:]+")
_NOT_LABEL = re.compile(r"[^a-zA-Z0-9_]")
_UNDERSCORES = re.compile(r"__+")
_GAUGE, _COUNTER, _UPDOWN = "gauge", "counter", "updown"
_CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
_NO_RECORDED_VALUE = metrics_pb2.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK


def media_type(headers: Headers) -> str:
    """PROTOBUF or JSON, as the request's Content-Type says; 415 for anything else."""
    content_type = headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in (PROTOBUF, JSON):
        raise HTTPException(
            415, f"Content-Type {content_type!r}: OTLP/HTTP sends {PROTOBUF!r} or {JSON!r}"
        )
    return media


def _bound_json_points(tree: Any, limit_points: int) -> None:
    """413 for a JSON request of more than `limit_points` data points, counted before
    protobuf's JSON parser (about 100 times slower than its binary one) reads any of them."""
    count = 0
    for resource in _items(tree, "resourceMetrics"):
        for scope in _items(resource, "scopeMetrics"):
            for metric in _items(scope, "metrics"):
                if isinstance(metric, dict):
                    for kind in metric.values():
                        count += len(_items(kind, "dataPoints"))
    if count > limit_points:
        raise TooLarge(
            f"{count} data points in one request; at most {limit_points} "
            "(JOBSCOPE_PUSH_MAX_READINGS): lower the exporter's batch size"
        )


def _items(node: Any, key: str) -> list[Any]:
    found = node.get(key) if isinstance(node, dict) else None
    return found if isinstance(found, list) else []


def decode(
    body: bytes, media: str, encoding: str, limit: int, limit_points: int
) -> ExportMetricsServiceRequest:
    """The request in `body` (gzip decompressed to at most `limit` bytes); 400 naming what
    is wrong if it is not an ExportMetricsServiceRequest, 413 for a JSON one of more than
    `limit_points` data points."""
    data = push.decompressed(body, encoding, limit)
    request = ExportMetricsServiceRequest()
    if media == PROTOBUF:
        try:
            request.ParseFromString(data)
        except DecodeError:
            raise ParameterError(
                "body", "corrupt protobuf: not an ExportMetricsServiceRequest"
            ) from None
        return request
    try:
        tree = orjson.loads(data)
        if not isinstance(tree, dict):
            raise json_format.ParseError(f"a JSON {type(tree).__name__}, not an object")
        _bound_json_points(tree, limit_points)
        json_format.ParseDict(tree, request, ignore_unknown_fields=True)
    except (orjson.JSONDecodeError, json_format.ParseError, RecursionError) as exc:
        message = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise ParameterError(
            "body", f"not an ExportMetricsServiceRequest in OTLP's JSON: {message}"
        ) from None
    return request


def parse(
    body: bytes,
    media: str,
    encoding: str,
    settings: ApiSettings,
    who: Principal,
    devices: PushDevices,
) -> push.Batch:
    """The readings of an OTLP body; 400 naming the first unusable part, 413 past the push
    limits: nothing of it is kept."""
    request = decode(
        body, media, encoding, settings.push_max_body_bytes, settings.push_max_readings
    )
    return readings(request, settings, who, devices)


def _points(metric: metrics_pb2.Metric) -> Any:
    data = getattr(metric, metric.WhichOneof("data") or "gauge")
    return data.data_points


def readings(
    request: ExportMetricsServiceRequest,
    settings: ApiSettings,
    who: Principal,
    devices: PushDevices,
) -> push.Batch:
    """The readings of a decoded request; what is not stored is counted in `skipped`."""
    count = sum(
        len(_points(metric))
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    )
    if count > settings.push_max_readings:
        raise TooLarge(
            f"{count} data points in one request; at most {settings.push_max_readings} "
            "(JOBSCOPE_PUSH_MAX_READINGS): lower the exporter's batch size"
        )
    batch = push.Batch()
    window = push.window(settings)
    source = push.source(who)
    for r, resource in enumerate(request.resource_metrics):
        where = f"resourceMetrics[{r}]"
        placed: tuple[str, dict[str, str]] | None = None
        for s, scope in enumerate(resource.scope_metrics):
            for m, metric in enumerate(scope.metrics):
                at = f"{where}.scopeMetrics[{s}].metrics[{m}]"
                kind = _kind(metric, batch)
                if kind is None:
                    continue
                name = push.check_metric_id(
                    f"{at}.name ({metric.name[:120]!r})",
                    metric_id(metric.name, metric.unit, kind),
                    settings,
                )
                for p, point in enumerate(_points(metric)):
                    value = _value(point, batch)
                    if value is None:
                        continue
                    if placed is None:
                        placed = _device(
                            where, resource.resource.attributes, settings, source, devices
                        )
                    point_at = f"{at}.dataPoints[{p}]"
                    labels = push.check_labels(
                        f"{point_at}.attributes",
                        labels_of(f"{point_at}.attributes", point.attributes),
                        settings,
                        source,
                    )
                    ns = point.time_unix_nano
                    us = push.check_in_window(
                        f"{point_at}.timeUnixNano", f"{ns} ns", ns // 1000, window
                    )
                    batch.readings.append(
                        Reading(us, placed[0], name, value, {**labels, **placed[1]})
                    )
    return batch


def _kind(metric: metrics_pb2.Metric, batch: push.Batch) -> str | None:
    """gauge, counter (monotonic cumulative sum) or updown (other cumulative sum); None for
    what is not stored, its points counted."""
    data = metric.WhichOneof("data")
    if data == "gauge":
        return _GAUGE
    if data == "sum":
        if metric.sum.aggregation_temporality != _CUMULATIVE:
            batch.skipped["delta"] += len(metric.sum.data_points)
            return None
        return _COUNTER if metric.sum.is_monotonic else _UPDOWN
    if data in ("histogram", "exponential_histogram"):
        batch.skipped["histograms"] += len(_points(metric))
    elif data == "summary":
        batch.skipped["summaries"] += len(_points(metric))
    return None


def _value(point: metrics_pb2.NumberDataPoint, batch: push.Batch) -> float | None:
    """The point's value as a float; None (counted) for no value, NaN or infinite."""
    which = point.WhichOneof("value")
    if which is None or point.flags & _NO_RECORDED_VALUE:
        batch.skipped["no_value"] += 1
        return None
    value = point.as_double if which == "as_double" else float(point.as_int)
    if not math.isfinite(value):
        batch.skipped["non_finite"] += 1
        return None
    return value


def _device(
    where: str,
    attributes: Iterable[KeyValue],
    settings: ApiSettings,
    source: str,
    devices: PushDevices,
) -> tuple[str, dict[str, str]]:
    """The device a resource names (host.name, else service.instance.id) and the labels it
    gives every reading (`source`, the map's `_device_alias`)."""
    found = {kv.key: text(kv.value) for kv in attributes if kv.key in DEVICE_ATTRIBUTES}
    key = next((k for k in DEVICE_ATTRIBUTES if found.get(k)), "")
    if not key:
        raise ParameterError(
            f"{where}.resource.attributes",
            "no host.name or service.instance.id: which device it belongs to is unknown "
            "(set the resource attribute, e.g. the Collector's resourcedetection processor)",
        )
    # place() names the device from a remote_write-like label: instance for an instance id
    label = "host" if key == "host.name" else "instance"
    try:
        return devices.place(where, {label: found[key]}, (), settings, source)
    except ParameterError as exc:
        message = exc.message.replace(f"{label} ", f"{key} ", 1)
        raise ParameterError(f"{where}.resource.attributes.{key}", message) from None


def metric_id(name: str, unit: str, kind: str) -> str:
    """An OTLP metric's name as Prometheus' translation writes it (UnderscoreEscapingWithSuffixes):
    `http.server.duration` in `s` -> `http_server_duration_seconds`."""
    tokens = [token for token in _NOT_NAME.split(name) if token]
    main, per = _unit_words(unit)
    if main and main not in tokens:
        tokens.append(main)
    if per:
        tokens.append(per)
    if kind == _COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == _GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    joined = "_".join(tokens)
    return f"_{joined}" if joined[:1].isdigit() else joined


def _unit_words(unit: str) -> tuple[str, str]:
    """(`watts`, `per_second`) of `W/s`: the words a unit appends, `{...}` annotations none."""
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    word = "" if not main or "{" in main or "}" in main else UNITS.get(main, main)
    per_word = "" if not per or "{" in per or "}" in per else PER_UNITS.get(per, per)
    return _clean(word), _clean(f"per_{per_word}") if per_word else ""


def _clean(word: str) -> str:
    return "_".join(token for token in _NOT_NAME.split(word.replace("_", " ")) if token)


def labels_of(where: str, attributes: Iterable[KeyValue]) -> dict[str, str]:
    """A data point's attributes as labels, keys as Prometheus' translation writes them; a
    ParameterError if two keys become one name."""
    labels: dict[str, str] = {}
    for kv in attributes:
        name = _UNDERSCORES.sub("_", _NOT_LABEL.sub("_", kv.key))
        if name[:1].isdigit():
            name = f"key_{name}"
        if name in labels:
            raise ParameterError(f"{where}.{name}", f"two attributes are named {name!r} as labels")
        labels[name] = text(kv.value)
    return labels


def text(value: AnyValue) -> str:
    """An attribute's value as a label's text."""
    plain = _plain(value)
    return plain if isinstance(plain, str) else orjson.dumps(plain).decode()


def _plain(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which in ("int_value", "double_value"):
        return str(getattr(value, which))
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if which == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    return value.string_value


def answer(batch: push.Batch, accepted: int, media: str) -> Response:
    """200 with an ExportMetricsServiceResponse, its partialSuccess counting what was
    skipped and why; X-Jobscope-Accepted counts the readings stored."""
    response = ExportMetricsServiceResponse()
    rejected = sum(batch.skipped[reason] for reason in SKIPPED)
    if rejected:
        why = ", ".join(
            f"{batch.skipped[reason]} {_WHY[reason]}" for reason in SKIPPED if batch.skipped[reason]
        )
        response.partial_success.rejected_data_points = rejected
        response.partial_success.error_message = f"data points not stored: {why}"
    headers = {"X-Jobscope-Accepted": str(accepted)}
    return _message(200, response, media, headers)


def refusal(exc: Exception, media: str) -> Response | None:
    """The google.rpc.Status answer to a refusal raised while serving a request of `media`
    (OTLP/HTTP's error body); None for an exception that is not a refusal."""
    if isinstance(exc, ParameterError):
        status, message = 400, f"invalid parameter {exc.parameter}: {exc.message}"
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    elif isinstance(exc, Forbidden):
        status, message = 403, str(exc)
    elif isinstance(exc, TooLarge):
        status, message = 413, str(exc)
    elif isinstance(exc, KafkaUnavailable):
        status, message = 503, _unwritten(exc)
    else:
        return None
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    body = Status(code=GRPC_CODES.get(status, 2), message=message)
    return _message(status, body, media, headers)


def _unwritten(exc: KafkaUnavailable) -> str:
    if exc.acknowledged:
        return (
            f"{exc}: the messages of {exc.acknowledged} device(s) had been acknowledged and "
            "are written, the others not"
        )
    return f"{exc}: nothing was written"


def _message(status: int, message: Message, media: str, headers: Mapping[str, str]) -> Response:
    if media == PROTOBUF:
        return Response(message.SerializeToString(), status, headers, PROTOBUF)
    body = json_format.MessageToJson(message, indent=None)
    return Response(body, status, headers, JSON)
