"""The read policy (api/visibility.py, docs/access.md) on every read route, through a second
API process started with JOBSCOPE_READ_POLICY=jobs beside the session's (which stays `open`),
with jobscope's own signed tokens for alice (user, project p1), bob (user, p2), pia (project
manager of p1), sam (support) and an agent. Names carry a tag of this module's own: the
worker's stack holds other modules' jobs."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest
from click.testing import CliRunner
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from fastapi.testclient import TestClient

from api.infra.config import ApiSettings
from api.infra.tokens import Principal, Role, create_token, decode
from api.main import create_app
from api.schemas import Job
from api.visibility import Viewer
from jobscope.cli import cli
from jobscope.client import Client as ApiClient
from jobscope.errors import ApiError
from stack import secrets, services
from stack.config import StackSettings
from stack.processes import free_port, wait_until
from tests import ports

from .conftest import Row, iso

TAG = uuid.uuid4().hex[:6]
ALICE, BOB, PIA, SAM, AGENT = (f"{n}-{TAG}" for n in ("alice", "bob", "pia", "sam", "agent"))
P1, P2 = f"p1-{TAG}", f"p2-{TAG}"
NODE_A, NODE_B, NODE_AGENT, NODE_LIVE = (f"rp-{TAG}-{n}" for n in ("a", "b", "agent", "live"))


@dataclass
class World:
    url: str
    """The API under JOBSCOPE_READ_POLICY=jobs."""
    tokens: dict[str, str]
    jobs: dict[str, str]
    """alice, bob, pia (her own job, in p1 too): their job ids."""
    now: datetime
    headers: Callable[[str], dict[str, str]] = field(repr=False)

    def get(self, who: str | None, path: str, **params: Any) -> httpx.Response:
        headers = self.headers(self.tokens[who]) if who else {}
        return httpx.get(f"{self.url}{path}", params=params, headers=headers, timeout=30)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def token_secret(stack_settings: StackSettings) -> str:
    return secrets.load_or_create(stack_settings.state_dir)["JOBSCOPE_TOKEN_SECRET"]


@pytest.fixture(scope="module")
def jobs_api(clickhouse: StackSettings) -> Iterator[str]:
    """An API process under the `jobs` policy, re-reading a live stream's job every 0.5 s
    (the 2 s default: the test only waits less for the same check)."""
    env = {"JOBSCOPE_READ_POLICY": "jobs", "JOBSCOPE_LIVE_JOB_CHECK_S": "0.5"}
    name, port = "api-read-policy", ports.port("read-policy")
    try:
        yield services.start_api(clickhouse, name=name, port=port, env=env)
    finally:
        services.process(clickhouse, name).stop(timeout=30)


@pytest.fixture(scope="module")
def world(
    jobs_api: str,
    token_secret: str,
    post_job: Callable[..., dict[str, Any]],
    insert_readings: Callable[[list[Row]], None],
) -> World:
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    hour = timedelta(hours=1)

    def mint(user: str, role: Role, **claims: Any) -> str:
        return create_token(token_secret, user, role, hour, **claims)

    tokens = {
        "alice": mint(ALICE, Role.USER, projects=[P1]),
        "bob": mint(BOB, Role.USER, projects=[P2]),
        "pia": mint(PIA, Role.PROJECT, projects=[P1]),
        "sam": mint(SAM, Role.SUPPORT),
        "agent": mint(AGENT, Role.AGENT, nodes=[NODE_AGENT]),
    }
    jobs = {}
    for who, user, project, node in (
        ("alice", ALICE, P1, NODE_A),
        ("bob", BOB, P2, NODE_B),
        ("pia", PIA, P1, f"rp-{TAG}-pia"),
    ):
        job_id = f"rp-{TAG}-{who}"
        post_job(
            job_id=job_id,
            user=user,
            project=project,
            nodes=[node],
            start=iso(now - hour),
            state="running",
        )
        jobs[who] = job_id
    insert_readings(
        [
            [now - timedelta(minutes=30), NODE_A, "rp_watt", 1.0, {}],
            [now - 2 * hour, NODE_A, "rp_watt", 2.0, {}],  # before alice's job
            [now - timedelta(minutes=30), NODE_B, "rp_watt", 3.0, {}],
            [now, NODE_A, "rp_now", 4.0, {}],
            [now, NODE_B, "rp_now", 5.0, {}],
        ]
    )
    return World(jobs_api, tokens, jobs, now, _auth)


def _job_routes(job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Every read route naming a job, with its parameters."""
    return [
        (f"/api/jobs/{job_id}", {}),
        (f"/api/jobs/{job_id}/metrics", {}),
        (f"/api/jobs/{job_id}/summary", {}),
        (f"/api/jobs/{job_id}/catalog", {}),
        (f"/api/jobs/{job_id}/live", {}),
        ("/api/metrics", {"job_id": job_id}),
        ("/rpc/get_metrics", {"job_id": job_id}),
        ("/rpc/available_metrics", {"params": orjson.dumps({"job_id": job_id}).decode()}),
        ("/api/metrics/dashboard", {"job_id": job_id}),
    ]


def test_a_job_of_someone_else_is_unknown_on_every_route(world: World) -> None:
    """alice gets 404 on bob's job from every route naming a job, word for word what an
    unknown job answers (ids cannot be probed); on her own job the route answers."""
    bob, unknown = world.jobs["bob"], f"rp-{TAG}-nobody"
    for (path, params), (unknown_path, unknown_params) in zip(
        _job_routes(bob), _job_routes(unknown), strict=True
    ):
        refused = world.get("alice", path, **params)
        never = world.get("alice", unknown_path, **unknown_params)
        assert refused.status_code == 404, (path, refused.text)
        assert refused.json()["error"] == never.json()["error"].replace(unknown, bob), path
    for path, params in _job_routes(world.jobs["alice"]):
        if path.endswith("/live"):
            continue  # a stream: test_live_is_checked_at_open_and_while_it_runs
        answer = httpx.get(
            f"{world.url}{path}",
            params=params,
            headers=_auth(world.tokens["alice"]),
            timeout=30,
            follow_redirects=False,
        )
        assert answer.status_code in (200, 307), (path, answer.text)


def test_a_comparison_naming_a_job_of_someone_else_is_unknown(world: World) -> None:
    """alice compares her job with bob's: 404, word for word what a comparison naming an
    unknown job answers (no figure of bob's job, and no telling it exists); her own job
    compared with itself answers (a read of others' jobs, audited, is left to the audit's
    test)."""
    alice, bob, unknown = world.jobs["alice"], world.jobs["bob"], f"rp-{TAG}-nobody"
    for ids in (f"{alice},{bob}", f"{bob},{alice}"):
        refused = world.get("alice", "/api/jobs/compare", ids=ids)
        never = world.get("alice", "/api/jobs/compare", ids=ids.replace(bob, unknown))
        assert refused.status_code == never.status_code == 404, refused.text
        assert refused.json() == orjson.loads(never.content.replace(unknown.encode(), bob.encode()))
    own = world.get("alice", "/api/jobs/compare", ids=f"{alice},{alice}")
    assert own.status_code == 200, own.text
    assert [row["job"]["job_id"] for row in own.json()["jobs"]] == [alice, alice]
    assert world.get(None, "/api/jobs/compare", ids=f"{alice},{bob}").status_code == 401


def test_no_token_no_read_and_health_open(world: World) -> None:
    assert world.get(None, "/api/jobs").status_code == 401
    assert world.get(None, f"/api/jobs/{world.jobs['alice']}").status_code == 401
    assert world.get(None, "/health").status_code == 200


def _listed(world: World, who: str) -> set[str]:
    answer = world.get(who, "/api/jobs", limit=100_000)
    assert answer.status_code == 200, answer.text
    return {job["job_id"] for job in answer.json()}


def test_the_list_holds_only_visible_jobs(world: World) -> None:
    """Filtered in SQL: alice lists her jobs only, pia hers and p1's, sam everything, an
    agent nothing; `limit` counts visible jobs."""
    ours = set(world.jobs.values())
    alice = world.get("alice", "/api/jobs", limit=100_000).json()
    assert {j["user"] for j in alice} == {ALICE}
    assert _listed(world, "alice") & ours == {world.jobs["alice"]}
    assert _listed(world, "bob") & ours == {world.jobs["bob"]}
    assert _listed(world, "pia") & ours == {world.jobs["alice"], world.jobs["pia"]}
    assert _listed(world, "sam") >= ours
    assert _listed(world, "agent") == set()
    one = world.get("alice", "/api/jobs", limit=1).json()
    assert [j["job_id"] for j in one] == [world.jobs["alice"]]


def test_a_project_manager_reads_its_projects_jobs(world: World) -> None:
    for path, params in _job_routes(world.jobs["alice"])[:4]:
        assert world.get("pia", path, **params).status_code == 200, path
    assert world.get("pia", f"/api/jobs/{world.jobs['bob']}").status_code == 404
    # a plain user of p1 does not read p1's other jobs (JOBSCOPE_MEMBERS_READ_PROJECT=false)
    assert world.get("alice", f"/api/jobs/{world.jobs['pia']}").status_code == 404


def test_device_reads_inside_ones_job_only(world: World) -> None:
    """alice reads her job's node over a time inside her job; outside it in time, another's
    node, or both nodes at once: 403 saying device reads outside one's jobs are for support
    and admin. sam reads any device."""
    start, end = world.now - timedelta(minutes=40), world.now - timedelta(minutes=20)
    inside = {"start_time": iso(start), "end_time": iso(end), "metrics": "rp_watt"}
    for path in ("/api/metrics", "/rpc/get_metrics"):
        allowed = world.get("alice", path, devices=NODE_A, **inside)
        assert allowed.status_code == 200, allowed.text
        assert [r["value"] for r in allowed.json()] == [1.0]
    before = {
        "start_time": iso(world.now - timedelta(hours=3)),
        "end_time": iso(world.now - timedelta(minutes=20)),
    }
    for who, devices, times in (
        ("alice", NODE_A, before),
        ("alice", NODE_B, inside),
        ("alice", f"{NODE_A},{NODE_B}", inside),
        ("agent", NODE_AGENT, inside),
    ):
        refused = world.get(who, "/api/metrics", devices=devices, **times)
        assert refused.status_code == 403, (who, devices, refused.text)
        assert "are for support and admin" in refused.json()["error"]
    everything = world.get("sam", "/api/metrics", devices=f"{NODE_A},{NODE_B}", **before)
    assert sorted(r["value"] for r in everything.json()) == [1.0, 2.0, 3.0]


def test_available_metrics_follow_the_same_rules(world: World) -> None:
    at = iso(world.now + timedelta(seconds=1))
    mine = orjson.dumps({"devices": [NODE_A]}).decode()
    theirs = orjson.dumps({"devices": [NODE_B]}).decode()
    allowed = world.get("alice", "/rpc/available_metrics", params=mine, at=at)
    assert allowed.status_code == 200, allowed.text
    listed = [(r["device_id"], r["metric_id"]) for r in allowed.json()]  # rows carry units too
    assert (NODE_A, "rp_now") in listed
    assert world.get("alice", "/rpc/available_metrics", params=theirs, at=at).status_code == 403
    assert world.get("alice", "/rpc/available_metrics").status_code == 403  # every device
    assert world.get("sam", "/rpc/available_metrics", params=theirs, at=at).status_code == 200


def test_devices_and_latest_values(world: World) -> None:
    """A user lists the nodes of their jobs only, and reads the newest values of a node of
    their running job, not of another's."""
    listed = {d["device_id"] for d in world.get("alice", "/api/devices").json()}
    assert NODE_A in listed and NODE_B not in listed
    assert {d["device_id"] for d in world.get("sam", "/api/devices").json()} >= {NODE_A, NODE_B}
    wait_until(
        lambda: world.get("sam", f"/api/devices/{NODE_A}/latest").status_code == 200,
        60,
        "the node's newest values",
    )
    mine = world.get("alice", f"/api/devices/{NODE_A}/latest")
    assert mine.status_code == 200 and mine.json(), mine.text
    theirs = world.get("alice", f"/api/devices/{NODE_B}/latest")
    assert theirs.status_code == 403 and "support and admin" in theirs.json()["error"]


def test_the_dashboard_of_ones_newest_job(world: World) -> None:
    def location(who: str, **params: Any) -> httpx.Response:
        return httpx.get(
            f"{world.url}/api/metrics/dashboard",
            params=params,
            headers=_auth(world.tokens[who]),
            timeout=30,
            follow_redirects=False,
        )

    newest = location("bob")
    assert newest.status_code == 307 and world.jobs["bob"] in newest.headers["location"]
    assert location("alice", job_id=world.jobs["bob"]).status_code == 404
    assert location("agent").status_code == 404


def test_support_reads_everything_and_writes_nothing(world: World) -> None:
    sam = _auth(world.tokens["sam"])
    for path, params in _job_routes(world.jobs["bob"])[:4]:
        assert world.get("sam", path, **params).status_code == 200, path
    reading = {"timestamp": iso(world.now), "device_id": NODE_B, "metric_id": "m", "value": 1}
    writes = [
        ("POST", "/api/jobs", {"job_id": f"rp-{TAG}-sam", "nodes": ["x"]}),
        ("PATCH", f"/api/jobs/{world.jobs['bob']}", {"state": "terminated"}),
        ("POST", "/api/metrics", reading),
        ("POST", f"/api/jobs/{world.jobs['bob']}/on-demand", {}),
        ("POST", "/api/tokens", {"user": "x", "role": "admin"}),
    ]
    for method, path, body in writes:
        refused = httpx.request(method, f"{world.url}{path}", json=body, headers=sam, timeout=30)
        assert refused.status_code == 403, (method, path, refused.text)


def test_an_agent_pushes_for_its_declared_nodes_only(world: World) -> None:
    """At any time of the push window (no job runs on its node), and nowhere else."""

    def push(device: str) -> httpx.Response:
        reading = {"timestamp": iso(world.now), "device_id": device, "metric_id": "m", "value": 1}
        return httpx.post(
            f"{world.url}/api/metrics",
            json=reading,
            headers=_auth(world.tokens["agent"]),
            timeout=30,
        )

    accepted = push(NODE_AGENT)
    assert accepted.status_code == 202, accepted.text
    refused = push(NODE_A)
    assert refused.status_code == 403 and NODE_A in refused.json()["error"], refused.text
    # a node's domain suffix is dropped, as for every device id
    assert push(f"{NODE_AGENT}.site.example.org").status_code == 202


@dataclass
class _Stream:
    """A live stream read in a thread, keeping its events."""

    url: str
    token: str
    job_id: str
    events: list[tuple[str, Any]] = field(default_factory=list)
    done: bool = False
    failure: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            with ApiClient(self.url, self.token) as client:
                self.events.extend(client.live_events(self.job_id))
        except BaseException as exc:  # reported by the test
            self.failure = exc
        finally:
            self.done = True


def test_live_is_checked_at_open_and_while_it_runs(
    world: World, api_url: str, api_tokens: dict[str, str], post_job: Callable[..., Any]
) -> None:
    """alice's stream of bob's job is refused at open (404); her stream of her own job sends
    `error` and ends once the job's user changes."""
    with ApiClient(world.url, world.tokens["alice"]) as client, pytest.raises(ApiError) as info:
        next(iter(client.live_events(world.jobs["bob"])))
    assert info.value.status == 404, repr(info.value)
    job_id = f"rp-{TAG}-live"
    start = iso(world.now - timedelta(minutes=5))
    post_job(job_id=job_id, user=ALICE, nodes=[NODE_LIVE], start=start, state="running")
    stream = _Stream(world.url, world.tokens["alice"], job_id)
    wait_until(lambda: stream.done or stream.events, 30, "the stream's first event")
    assert stream.events and stream.events[0][0] == "live", (stream.events, stream.failure)
    patched = httpx.patch(
        f"{api_url}/api/jobs/{job_id}",
        json={"user": f"carol-{TAG}"},
        headers=_auth(api_tokens["scheduler"]),
        timeout=30,
    )
    assert patched.status_code in (200, 202), patched.text
    wait_until(lambda: stream.done, 30, "the stream to end once alice no longer owns the job")
    assert stream.failure is None, repr(stream.failure)
    name, data = stream.events[-1]
    assert name == "error" and "no longer visible" in data["error"], stream.events


def test_reads_of_others_jobs_are_audited(
    world: World, admin_client: Client, reader_client: Client
) -> None:
    """sam's read of alice's job is recorded (who, role, route, job, when) in audit_log; alice's
    own read is not. The table is the admin's: the SQL reader is refused."""
    job_id = world.jobs["alice"]
    assert world.get("alice", f"/api/jobs/{job_id}/summary").status_code == 200
    assert world.get("sam", f"/api/jobs/{job_id}/summary").status_code == 200

    def rows() -> list[tuple[Any, ...]]:
        return admin_client.query(
            "SELECT user, role, route, job_user, at FROM audit_log WHERE job_id = {j:String} "
            "ORDER BY at",
            parameters={"j": job_id},
        ).result_rows

    wait_until(lambda: any(r[0] == SAM for r in rows()), 60, "sam's read in audit_log")
    recorded = rows()
    assert not [r for r in recorded if r[0] == ALICE], recorded
    sam = next(r for r in recorded if r[0] == SAM)
    assert sam[1:4] == ("support", "/api/jobs/{job_id}/summary", ALICE)
    assert abs(sam[4].replace(tzinfo=None) - datetime.now(UTC).replace(tzinfo=None)) < timedelta(
        minutes=5
    )
    for statement in (
        "SELECT count() FROM audit_log",
        "SELECT count() FROM default.audit_log",
        "SELECT count() FROM loop('default', 'audit_log') LIMIT 1",
        "SELECT count() FROM merge('default', '^audit')",
    ):
        with pytest.raises(DatabaseError):
            reader_client.query(statement)


def test_under_open_anonymous_reads_still_work(api_url: str, world: World) -> None:
    """The session's API keeps the default policy: Kwollect's contract, no token needed."""
    job_id = world.jobs["bob"]
    assert httpx.get(f"{api_url}/api/jobs/{job_id}", timeout=30).status_code == 200
    readings = httpx.get(f"{api_url}/api/metrics", params={"job_id": job_id}, timeout=30)
    assert readings.status_code == 200 and readings.json(), readings.text
    devices = httpx.get(
        f"{api_url}/rpc/get_metrics", params={"devices": NODE_B, "metrics": "rp_watt"}, timeout=30
    )
    assert devices.status_code == 200, devices.text


def test_tokens_carry_projects_and_nodes(
    api_url: str, api_tokens: dict[str, str], token_secret: str
) -> None:
    """POST /api/tokens and `jobscope token create` put them in the token; bad ones: 400."""
    admin = _auth(api_tokens["admin"])
    asked = {"user": "pi", "role": "project", "projects": ["p1", "p2"], "ttl_days": 1}
    created = httpx.post(f"{api_url}/api/tokens", json=asked, headers=admin, timeout=30)
    assert created.status_code == 201, created.text
    who = decode(token_secret, created.json()["token"])
    assert (who.role, who.projects) == (Role.PROJECT, frozenset({"p1", "p2"}))
    for bad in ({"projects": [""]}, {"nodes": ["x" * 300]}, {"nodes": "n-1"}):
        refused = httpx.post(
            f"{api_url}/api/tokens", json={**asked, **bad}, headers=admin, timeout=30
        )
        assert refused.status_code == 400, refused.text
    done = CliRunner().invoke(
        cli,
        [
            *("--api", api_url, "--token", api_tokens["admin"], "token", "create"),
            *("--user", "probe", "--role", "agent", "--node", "n-1", "--node", "n-2"),
        ],
    )
    assert done.exit_code == 0, done.output
    agent = decode(token_secret, done.output.strip())
    assert (agent.role, agent.nodes) == (Role.AGENT, ("n-1", "n-2"))


def test_members_read_their_projects_only_when_configured() -> None:
    """JOBSCOPE_MEMBERS_READ_PROJECT widens what every own-jobs role reads to its projects;
    a reads_need_token setting means `authenticated`."""
    alice = Principal("alice", Role.USER, projects=frozenset({"p1"}))
    job = Job(
        job_id="1",
        user="bob",
        project="p1",
        queue="",
        nodes=[],
        start=None,
        end=None,
        state="running",
        site="",
        labels={},
        updated_at="",
    )
    assert not Viewer(alice, "jobs").sees(job)
    assert Viewer(alice, "jobs", members_read_project=True).sees(job)
    assert not Viewer(Principal("x", Role.AGENT), "jobs").sees(job)
    assert Viewer(None, "open").sees(job)
    old = ApiSettings(clickhouse_api_password="x", reads_need_token=True)
    assert old.effective_read_policy == "authenticated"


def test_a_read_is_answered_when_its_audit_record_is_lost(
    clickhouse: StackSettings,
    world: World,
    api_tokens: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Kafka unreachable (nothing listens at its address): the admin's read of alice's job is
    answered, and the lost record is logged naming who read what."""
    settings = ApiSettings(
        clickhouse_port=clickhouse.clickhouse_port,
        clickhouse_api_password=secrets.load_or_create(clickhouse.state_dir)[
            "JOBSCOPE_CLICKHOUSE_API_PASSWORD"
        ],
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        admin_token=api_tokens["admin"],
        read_policy="jobs",
        kafka_write_timeout_s=0.5,
        revocations_load_timeout_s=0.1,
    )
    job_id = world.jobs["alice"]
    with TestClient(create_app(settings)) as client, caplog.at_level(logging.ERROR):
        answer = client.get(f"/api/jobs/{job_id}", headers=_auth(api_tokens["admin"]))
    assert answer.status_code == 200 and answer.json()["user"] == ALICE, answer.text
    assert f"the read of job {job_id} by admin (admin)" in caplog.text, caplog.text
