"""The abuse step's verdicts (bench/systems/jobscope_abuse.py) count every answer that is not a
success as a failure: a quick refusal (503), a wrong count, a connection reset. Judged on the
p99 of every answer, quick refusals would pull it down and meet the goal by refusing.

The answers come from a real HTTP server on loopback standing in for the API (an API that
refuses or resets on cue cannot be had from the real one: its refusals depend on the load)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.systems import jobscope_abuse as abuse
from bench.systems.jobscope_api import rows
from stack.config import StackSettings

BODY = b"[\n" + b"".join(b'{"value": %d},\n' % i for i in range(10)) + b"]\n"
EXPECTED = rows("json", [BODY])


class _Api(BaseHTTPRequestHandler):
    """`/ok`: the small query's answer; `/refuse`: a quick 503; `/reset`: the connection
    reset before any answer; `/flaky`: every tenth request refused, the others answered."""

    calls = 0

    def do_GET(self) -> None:
        _Api.calls += 1
        if self.path == "/reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        refuse = self.path == "/refuse" or (self.path == "/flaky" and _Api.calls % 10 == 0)
        body = b"busy" if refuse else BODY
        self.send_response(503 if refuse else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def api_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _judged(answers: list[tuple[str, float]]) -> dict[str, bool]:
    """The verdicts with this phase as the one under abuse, and freshness that meets its goal."""
    phase = abuse.answers_summary(answers)
    return abuse.verdicts(
        {
            "api_p99_under_sql_abuse_s": phase["p99_s"],
            "api_success_ratio_under_sql_abuse": phase["success_ratio"],
            "freshness_p99_under_sql_abuse_s": 0.5,
            "freshness_seen_ratio_under_sql_abuse": 1.0,
        }
    )


def test_quick_refusals_fail_the_goal(api_url: str) -> None:
    """One answer in ten refused at once: every answer's p99 is well within the bound, the
    successes' too, but a tenth of the answers failed."""
    answers = abuse.back_to_back(api_url, "/flaky", EXPECTED, 1.0, 5.0)
    phase = abuse.answers_summary(answers)
    assert phase["outcomes"]["HTTP 503"] >= 1 and phase["outcomes"][abuse.OK] >= 9
    assert phase["all_answers"]["p99_s"] < 1.0 and phase["p99_s"] < 1.0
    assert phase["success_ratio"] < abuse.SUCCESS_GOAL
    assert _judged(answers) == {
        "api_under_sql_abuse_goal_met": False,
        "freshness_under_sql_abuse_goal_met": True,
    }


def test_successful_answers_within_the_bound_meet_the_goal(api_url: str) -> None:
    answers = abuse.back_to_back(api_url, "/ok", EXPECTED, 0.5, 5.0)
    assert {outcome for outcome, _ in answers} == {abuse.OK}
    assert abuse.answers_summary(answers)["success_ratio"] == 1.0
    assert _judged(answers)["api_under_sql_abuse_goal_met"] is True


def test_refusals_and_resets_are_failures_not_figures(api_url: str) -> None:
    """Refused or reset, no answer counts as a success nor enters the successes' p99; the
    phase goes on (a reset used to end it with an exception)."""
    answers = [
        *abuse.back_to_back(api_url, "/refuse", EXPECTED, 0.3, 5.0),
        *abuse.back_to_back(api_url, "/reset", EXPECTED, 0.3, 5.0),
    ]
    outcomes = {outcome for outcome, _ in answers}
    assert "HTTP 503" in outcomes
    assert any(outcome.startswith("no answer: ") for outcome in outcomes), outcomes
    phase = abuse.answers_summary(answers)
    assert phase["success_ratio"] == 0.0 and phase["p99_s"] is None
    assert phase["all_answers"]["p99_s"] is not None
    assert _judged(answers)["api_under_sql_abuse_goal_met"] is False


def test_slow_successes_fail_the_goal() -> None:
    answers = [(abuse.OK, 0.1)] * 95 + [(abuse.OK, 1.5)] * 5
    assert _judged(answers)["api_under_sql_abuse_goal_met"] is False


def test_probes_never_seen_fail_the_freshness_goal() -> None:
    """Probes lost under abuse: those seen were fresh, but one in five never showed up,
    though produced long enough before the end to be staler than the goal by then."""
    freshness = abuse._Freshness(StackSettings())
    for i in range(100):  # a probe every 100 ms for 10 s
        ts = 1_000_000_000_000_000 + i * 100_000
        freshness.sent_at[ts] = ts / 1e6
        if i % 5:
            freshness.seen[ts] = 0.2
    summary = freshness.summary()
    assert summary["p99_s"] == pytest.approx(0.2)
    assert summary["unseen_past_goal"] == 16  # 0, 5, ..., 75: before the last 2 s
    assert summary["seen_ratio"] == round(80 / 96, 4)
    verdict = abuse.verdicts(
        {
            "api_p99_under_sql_abuse_s": 0.1,
            "api_success_ratio_under_sql_abuse": 1.0,
            "freshness_p99_under_sql_abuse_s": summary["p99_s"],
            "freshness_seen_ratio_under_sql_abuse": summary["seen_ratio"],
        }
    )
    assert verdict == {
        "api_under_sql_abuse_goal_met": True,
        "freshness_under_sql_abuse_goal_met": False,
    }
