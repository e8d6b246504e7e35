"""Two sites and a centre: three real Kafka brokers, MirrorMaker 2 copying each site's
`readings`, `jobs` and `oar-changes` into the centre (`siteA.readings`...), a central
ClickHouse consuming the copies (JOBSCOPE_SITES) and the API in front of it. Readings produced
at each site are queryable centrally with their site; jobs of the same id at two sites stay
apart, OAR's change streams included; the lag from a site's broker to a reading queryable
centrally is measured and printed."""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import orjson
import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from connectors.mirror import MirrorMaker, MirrorSettings
from kafka.message import pack
from kafka.reading import Reading
from stack import services
from stack.config import StackSettings
from stack.processes import wait_until
from tests import ports

SITES = ("siteA", "siteB")


@dataclass(frozen=True)
class Federation:
    sites: dict[str, StackSettings]
    central: StackSettings
    mirror: MirrorMaker
    admin: Client

    def producer(self, site: str) -> Producer:
        return Producer({"bootstrap.servers": self.sites[site].kafka_bootstrap, "linger.ms": 0})


def _broker(state: str, pair: int) -> StackSettings:
    """The settings of broker `pair` (its port pair in the table's "multisite" range), with
    the centre's ClickHouse, API and /metrics ports (the range's last three)."""
    *_, clickhouse, api, metrics = ports.ports("multisite")
    return StackSettings(
        state_dir=ports.state_dir("multisite") / state,
        kafka_port=ports.port("multisite", 2 * pair),
        kafka_controller_port=ports.port("multisite", 2 * pair + 1),
        kafka_heap="256m",
        clickhouse_port=clickhouse,
        api_port=api,
        producer_metrics_port=metrics,
    )


@pytest.fixture(scope="module")
def federation() -> Iterator[Federation]:
    sites = {site: _broker(site, i) for i, site in enumerate(SITES)}
    central = _broker("central", len(SITES))
    mirror = MirrorMaker(
        MirrorSettings(
            sites={site: s.kafka_bootstrap for site, s in sites.items()},
            central=central.kafka_bootstrap,
            state_dir=central.state_dir,
        )
    )
    stacks = [*sites.values(), central]
    for stack in stacks:  # leftovers of a crashed run
        mirror.stop()
        services.stop_all(stack)
    shutil.rmtree(central.state_dir.parent, ignore_errors=True)
    try:
        with ThreadPoolExecutor(len(stacks)) as pool:  # each site's topics, as `make up` has
            list(pool.map(services.start_kafka, stacks))
        mirror.start()
        with pytest.MonkeyPatch.context() as env:
            env.setenv("JOBSCOPE_SITES", ",".join(SITES))  # the central schema's subscriptions
            services.start_clickhouse(central)
        services.start_api(central)
        yield Federation(sites, central, mirror, services.clickhouse_client(central, "jobscope"))
    finally:
        services.process(central, "api").stop()
        services.process(central, "clickhouse").stop()
        mirror.stop()
        for stack in stacks:
            services.process(stack, "kafka").stop()


def _publish(producer: Producer, topic: str, key: str, value: bytes) -> None:
    producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(10) == 0, f"not delivered to {topic}"


def _reading(device: str, metric: str, value: float, at: datetime) -> bytes:
    us = (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return pack([Reading(us, device, metric, value)]).payload


def _job(job_id: str, nodes: list[str], start: datetime, end: datetime) -> bytes:
    return orjson.dumps(
        {
            "job_id": job_id,
            "nodes": nodes,
            "start": start.isoformat(),
            "end": end.isoformat(),
            "state": "terminated",
        }
    )


def _rows(admin: Client, sql: str, **params: object) -> list[tuple]:
    return admin.query(sql, parameters=params).result_rows


def test_readings_and_jobs_of_two_sites_apart_at_the_centre(federation: Federation) -> None:
    """Same device name, same job id at both sites: the centre keeps them apart by site."""
    metric = f"multisite_power_watt_{time.monotonic_ns()}"
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    for i, site in enumerate(SITES):
        producer = federation.producer(site)
        for k in range(3):
            at = start + timedelta(minutes=1, seconds=k)
            _publish(
                producer, "readings", "node-1", _reading("node-1", metric, 100 * (i + 1) + k, at)
            )
        _publish(
            producer, "jobs", "42", _job("42", ["node-1"], start, start + timedelta(minutes=2))
        )

    def stored() -> list[tuple]:
        return _rows(
            federation.admin,
            "SELECT labels['_site'] AS site, count() FROM metrics FINAL "
            "WHERE metric_id = {m:String} GROUP BY site ORDER BY site",
            m=metric,
        )

    wait_until(lambda: stored() == [("siteA", 3), ("siteB", 3)], 60, "both sites' readings")
    wait_until(
        lambda: (
            _rows(federation.admin, "SELECT site FROM jobs FINAL WHERE job_id = '42' ORDER BY site")
            == [("siteA",), ("siteB",)]
        ),
        60,
        "job 42 of both sites",
    )

    api = federation.central.api_url
    ambiguous = httpx.get(f"{api}/api/jobs/42", timeout=10)
    assert ambiguous.status_code == 400, ambiguous.text
    assert "'siteA', 'siteB'" in ambiguous.text and "site" in ambiguous.text
    assert httpx.get(f"{api}/api/jobs/42/metrics", timeout=10).status_code == 400
    job_b = httpx.get(f"{api}/api/jobs/42", params={"site": "siteB"}, timeout=10)
    assert job_b.status_code == 200 and job_b.json()["site"] == "siteB", job_b.text
    assert httpx.get(f"{api}/api/jobs/42", params={"site": "siteC"}, timeout=10).status_code == 404
    listed = httpx.get(f"{api}/api/jobs", params={"site": "siteA"}, timeout=10).json()
    assert [(j["job_id"], j["site"]) for j in listed] == [("42", "siteA")]

    for i, site in enumerate(SITES):
        asked = {"site": site, "metrics": metric}
        readings = httpx.get(f"{api}/api/jobs/42/metrics", params=asked, timeout=30)
        assert readings.status_code == 200, readings.text
        assert [(r["device_id"], r["value"], r["labels"]) for r in readings.json()] == [
            ("node-1", 100 * (i + 1) + k, {"_site": site}) for k in range(3)
        ]
        summary = httpx.get(f"{api}/api/jobs/42/summary", params=asked, timeout=30).json()
        assert [(m["device_id"], m["max"]) for m in summary["metrics"]] == [
            ("node-1", 100 * (i + 1) + 2)
        ]
        catalog = httpx.get(f"{api}/api/jobs/42/catalog", params={"site": site}, timeout=30)
        assert [(c["metric_id"], c["count"]) for c in catalog.json()] == [(metric, 3)]
        by_device = httpx.get(
            f"{api}/api/metrics",
            params={**asked, "devices": "node-1", "start_time": start.isoformat()},
            timeout=30,
        )
        assert [r["value"] for r in by_device.json()] == [100 * (i + 1) + k for k in range(3)]


def _oar_change(table: str, lsn: int, **row: object) -> bytes:
    """A change as connectors/oar-jobs.json writes it to `oar-changes` (the new row flattened,
    with Debezium's table, LSN, commit time and deletion flag)."""
    meta = {"__table": table, "__lsn": lsn, "__source_ts_ms": lsn, "__deleted": "false"}
    return orjson.dumps({**row, **meta})


def test_oar_changes_of_two_sites_become_their_own_jobs(federation: Federation) -> None:
    """Each site's OAR change stream (its `oar-changes`, mirrored) maps to jobs of that site:
    the same OAR job id and resource ids at both sites, each with its own nodes."""
    base = int(time.time() * 1000)
    for i, site in enumerate(SITES):
        node = f"oar{i}-node-1.{site}.example.org"
        changes = [
            _oar_change("resources", base + 1, resource_id=1, network_address=node),
            _oar_change("assigned_resources", base + 2, moldable_job_id=70, resource_id=1),
            _oar_change(
                "jobs",
                base + 3,
                job_id=4242,
                job_user=f"user-{site}",
                state="Running",
                start_time=base // 1000,
                assigned_moldable_job=70,
            ),
        ]
        producer = federation.producer(site)
        for change in changes:
            _publish(producer, "oar-changes", "", change)

    expected = [
        ("siteA", "user-siteA", ["oar0-node-1"], "running"),
        ("siteB", "user-siteB", ["oar1-node-1"], "running"),
    ]
    wait_until(
        lambda: (
            _rows(
                federation.admin,
                "SELECT site, user, nodes, state FROM jobs FINAL WHERE job_id = '4242' "
                "ORDER BY site",
            )
            == expected
        ),
        60,
        "OAR job 4242 of both sites",
    )
    api = federation.central.api_url
    job = httpx.get(f"{api}/api/jobs/4242", params={"site": "siteB"}, timeout=10).json()
    assert (job["site"], job["nodes"]) == ("siteB", ["oar1-node-1"])


def test_lag_from_a_site_to_the_centre(federation: Federation) -> None:
    """Readings produced at a site, timed until MirrorMaker has copied them into the central
    cluster and until the central ClickHouse answers them."""
    copies = Consumer(
        {"bootstrap.servers": federation.central.kafka_bootstrap, "group.id": "lag-probe"}
    )
    partitions = copies.list_topics("siteA.readings", timeout=10).topics["siteA.readings"]
    copies.assign([TopicPartition("siteA.readings", p, OFFSET_END) for p in partitions.partitions])
    producer = federation.producer("siteA")
    mirrored, queryable = [], []
    try:
        for k in range(5):
            metric = f"multisite_lag_{time.monotonic_ns()}"
            sent = time.monotonic()
            _publish(
                producer, "readings", "node-9", _reading("node-9", metric, k, datetime.now(UTC))
            )
            wait_until(
                lambda metric=metric: _copied(copies, metric), 30, f"copy {k} at the centre", 0
            )
            mirrored.append(time.monotonic() - sent)
            wait_until(
                lambda metric=metric: (
                    _rows(
                        federation.admin,
                        "SELECT labels['_site'] FROM metrics WHERE metric_id = {m:String}",
                        m=metric,
                    )
                    == [("siteA",)]
                ),
                60,
                f"reading {k} queryable at the centre",
                0.02,
            )
            queryable.append(time.monotonic() - sent)
    finally:
        copies.close()
    print(
        f"\nsite -> central over {len(mirrored)} readings: copied by MirrorMaker in median "
        f"{statistics.median(mirrored):.3f} s (max {max(mirrored):.3f} s), queryable in median "
        f"{statistics.median(queryable):.2f} s (max {max(queryable):.2f} s)"
    )


def _copied(consumer: Consumer, metric: str) -> bool:
    """The next copy the probe reads is the reading of `metric`."""
    message = consumer.poll(0.05)
    return message is not None and not message.error() and metric.encode() in message.value()
