"""Every operation of the API's OpenAPI document fuzzed by schemathesis against a real API
process: requests that fit the schema and requests that do not, with the admin token so that
writes are exercised too. No answer may be a 5xx, and each must conform to the schema
(status code documented, content type, headers, body).

Reproducible and bounded: hypothesis derandomized, no example database, no shrinking,
MAX_EXAMPLES per operation and generation mode, each of which must have answered all of them
(an operation for which no case was generated fails, however many the others made).

The fuzzed API publishes its writes (jobs, pushed readings, on-demand activations) to topics
of its own that nothing ingests, so that generated jobs and readings never reach the tables
other tests read; its reads hit the session's ClickHouse. `GET /api/jobs/{id}/live` is left
out: a stream of a running job does not end (its parameters are covered in test_live.py).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import hypothesis
import pytest
import schemathesis
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, Phase
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from stack.config import StackSettings

from .test_limits import extra_api

MAX_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
LEFT_OUT = {"get_job_live"}


@pytest.fixture(scope="module")
def fuzzed_api(clickhouse: StackSettings) -> Iterator[str]:
    suffix = uuid.uuid4().hex[:8]
    topics = {name: f"fuzz-{name}-{suffix}" for name in ("jobs", "readings", "ondemand")}
    admin = AdminClient({"bootstrap.servers": clickhouse.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics.values()]).values():
        future.result(30)
    env = {
        "JOBSCOPE_JOBS_TOPIC": topics["jobs"],
        "JOBSCOPE_READINGS_TOPIC": topics["readings"],
        "JOBSCOPE_ONDEMAND_TOPIC": topics["ondemand"],
        "JOBSCOPE_JSON_TOPIC": "",
        "JOBSCOPE_JOB_VISIBLE_TIMEOUT_S": "0",  # its jobs are never ingested: 202 at once
    }
    with extra_api(clickhouse, "api-fuzz", env) as url:
        yield url


def test_every_operation_answers_as_documented(fuzzed_api: str, api_tokens: dict[str, str]) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzzed_api}/openapi.json", timeout=30)
    headers = {"Authorization": f"Bearer {api_tokens['admin']}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    failures: list[str] = []
    answered: Counter[tuple[str, int]] = Counter()
    made: dict[tuple[str, str], int] = {}  # requests answered per operation and mode
    for operation in operations:
        if operation.definition.raw.get("operationId") in LEFT_OUT:
            continue
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            before = answered.total()

            @hypothesis.settings(
                max_examples=MAX_EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: schemathesis.Case) -> None:
                response = case.call_and_validate(
                    base_url=fuzzed_api,
                    headers=headers,
                    checks=CHECKS,
                    timeout=60,
                    allow_redirects=False,
                )
                answered[(case.operation.label, response.status_code)] += 1

            try:
                fuzz()
            except Exception as exc:  # every operation is tried; all failures are reported
                failures.append(f"{operation.label} ({mode.value}): {exc}")
            made[(operation.label, mode.value)] = answered.total() - before
    print("\n".join(f"{n:4d} {status} {label}" for (label, status), n in sorted(answered.items())))
    assert not failures, "\n\n".join(failures)
    short = {key: n for key, n in made.items() if n < MAX_EXAMPLES}
    assert not short, f"fewer than {MAX_EXAMPLES} requests answered: {short}"
