"""The per-job report (GET /api/jobs/{id}/report) against the real stack: a 2-node job of two
minutes with two power sources per node (the node's BMC, a wattmeter aliased to it); HTML
opened in real Chromium, PDF text read back, Markdown and JSON shapes, the read policy, and
a job whose text tries to inject markup."""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import httpx
import pypdf
import pytest

from api.infra.tokens import Role, create_token
from api.queries.metrics import rollup_for
from api.registry import registry
from api.report.model import step_for
from api.report.text import energy_text
from stack import secrets, services
from stack.config import REPO_ROOT, StackSettings
from tests import ports

from .conftest import Row

SUPERSET_PYTHON = REPO_ROOT / ".venv-superset" / "bin" / "python"
BROWSER_SCRIPT = REPO_ROOT / "tests" / "api" / "report_browser.py"
BMC = {1: 100.0, 2: 200.0}  # W, constant over the job
WATTMETER = {1: 110.0, 2: 210.0}
SECONDS = 120
INJECTED = '<script>fetch("https://evil.example/x")</script><img src="http://evil.example/i">'


@pytest.fixture(scope="module")
def job(
    insert_readings: Callable[[list[Row]], None], post_job: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """Two nodes, 2 min, every second: bmc_power_watt, a temperature, a byte counter; a
    wattmeter device measuring each node (`_device_alias`). A label carries markup."""
    tag = uuid.uuid4().hex[:6]
    start = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None, microsecond=0)
    nodes = {n: f"rep{tag}-node-{n}" for n in (1, 2)}
    rows: list[Row] = []
    for s in range(SECONDS + 1):
        t = start + timedelta(seconds=s)
        for n, node in nodes.items():
            rows.append([t, node, "bmc_power_watt", BMC[n], {}])
            rows.append([t, node, "bmc_temp_cpu0_celsius", 40.0 + n + s % 5, {}])
            rows.append([t, node, "network_ifinoctets_bytes_total", 1000.0 * s, {}])
            alias = {"_device_alias": node, "port": str(n)}
            rows.append([t, f"rep{tag}-wattmetre", "wattmetre_power_watt", WATTMETER[n], alias])
    insert_readings(rows)
    job_id = f"rep{tag}-job"
    post_job(
        job_id=job_id,
        user=f"rep{tag}-alice",
        nodes=list(nodes.values()),
        start=start.isoformat(),
        end=(start + timedelta(seconds=SECONDS)).isoformat(),
        state="terminated",
        labels={"name": INJECTED},
    )
    return {"job_id": job_id, "nodes": list(nodes.values()), "tag": tag}


def _report(api_url: str, job_id: str, fmt: str, **headers: str) -> httpx.Response:
    response = httpx.get(
        f"{api_url}/api/jobs/{job_id}/report", params={"format": fmt}, headers=headers, timeout=60
    )
    assert response.status_code == 200, response.text
    return response


class _Markup(HTMLParser):
    """Every tag and attribute of a document (text aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += [(tag, k, v or "") for k, v in attrs]


def test_json_shape_energy_and_plots(api_url: str, job: dict[str, Any]) -> None:
    report = _report(api_url, job["job_id"], "json").json()
    assert report["job"]["job_id"] == job["job_id"]
    assert report["summary"]["job_id"] == job["job_id"]
    assert report["step_s"] == 1  # 120 s: one point a second
    bmc, wattmeter = (sum(v * SECONDS for v in d.values()) for d in (BMC, WATTMETER))
    totals = {t["metric_id"]: t["joules"] for t in report["summary"]["energy_total"]}
    assert totals["bmc_power_watt"] == pytest.approx(bmc)
    assert totals["wattmetre_power_watt"] == pytest.approx(wattmeter)
    assert report["energy"]["joules"] == pytest.approx(wattmeter) or report["energy"][
        "joules"
    ] == pytest.approx(bmc)
    plots = {p["id"]: p for p in report["plots"]}
    assert {"job-power", "power-bmc_power_watt", "power-wattmetre_power_watt"} <= set(plots)
    per_node = plots["power-wattmetre_power_watt"]["series"]
    assert sorted(s["name"] for s in per_node) == sorted(job["nodes"])
    for line in per_node:
        n = 1 if line["name"].endswith("-1") else 2
        assert len(line["t"]) == SECONDS + 1 and set(line["v"]) == {WATTMETER[n]}
    job_power = {s["name"]: s["v"] for s in plots["job-power"]["series"]}
    assert set(job_power["bmc_power_watt"]) == {sum(BMC.values())}
    key_counter = "network_ifinoctets_bytes_total"
    key = {"bmc_temp_cpu0_celsius", key_counter}
    for metric in key:
        assert (f"key-{metric}" in plots) == registry().lookup(metric).key, metric
    assert {m["metric_id"] for m in report["metrics"]} >= key | {"bmc_power_watt"}
    # a counter's row: its increase over the job and mean rate, summed over the two nodes
    (counter,) = (m for m in report["metrics"] if m["metric_id"] == key_counter)
    assert counter["delta"] == pytest.approx(2 * 1000.0 * SECONDS)
    assert counter["rate"] == pytest.approx(2 * 1000.0)


def test_html_is_self_contained_and_escapes_the_job(api_url: str, job: dict[str, Any]) -> None:
    """The attack: a job label holding a script and an image from another host. It must stay
    text: no script, image, link or style sheet tag, no attribute naming another place."""
    response = _report(api_url, job["job_id"], "html")
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    markup = _Markup()
    markup.feed(response.text)
    assert not set(markup.tags) & {"script", "img", "link", "iframe", "object", "embed", "a"}
    assert set(markup.tags) >= {"svg", "path", "style", "table"}
    outside = [a for a in markup.attributes if "//" in a[2] or a[2].lower().startswith("java")]
    assert outside == [], outside
    assert "url(" not in response.text and "@import" not in response.text
    assert "&lt;script&gt;fetch(" in response.text  # shown, as text
    energy = _report(api_url, job["job_id"], "json").json()["energy"]
    assert energy_text(energy["joules"]) in response.text


def test_html_draws_every_plot_in_chromium_without_a_request_elsewhere(
    api_url: str, job: dict[str, Any]
) -> None:
    """The report opened by real Chromium from the API: every plot has a size and drawn
    lines, and the only requests the page made went to the API's host."""
    url = f"{api_url}/api/jobs/{job['job_id']}/report?format=html"
    plots = _report(api_url, job["job_id"], "json").json()["plots"]
    done = subprocess.run(
        [str(SUPERSET_PYTHON), str(BROWSER_SCRIPT), url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["title"] == f"jobscope report: job {job['job_id']}"
    assert [p["id"] for p in seen["plots"]] == [p["id"] for p in plots]
    for plot, expected in zip(seen["plots"], plots, strict=True):
        assert plot["width"] > 0 and plot["height"] > 0, plot
        assert len(plot["paths"]) == len(expected["series"]), plot
        assert all(p["width"] > 0 and p["length"] > 0 for p in plot["paths"]), plot
    # Chromium's own pages (its new tab: chrome://, data:) load from inside the browser
    network = [r for r in seen["requests"] if not r.startswith(("chrome://", "about:", "data:"))]
    assert network and all(r.startswith(api_url + "/") for r in network), network


def test_pdf_text_holds_the_energy(api_url: str, job: dict[str, Any]) -> None:
    response = _report(api_url, job["job_id"], "pdf")
    assert response.headers["content-type"] == "application/pdf"
    text = "".join(
        page.extract_text() for page in pypdf.PdfReader(io.BytesIO(response.content)).pages
    )
    energy = _report(api_url, job["job_id"], "json").json()["energy"]
    assert f"job energy: {energy_text(energy['joules'])}" in text
    assert job["job_id"] in text and "bmc_power_watt" in text


def test_markdown_shape(api_url: str, job: dict[str, Any]) -> None:
    text = _report(api_url, job["job_id"], "md").text
    assert text.startswith(f"# jobscope report: job {job['job_id']}\n")
    for heading in ("## Energy", "## Footprint and notes", "## Plots", "## Metrics"):
        assert f"\n{heading}\n" in text
    energy = _report(api_url, job["job_id"], "json").json()["energy"]
    assert f"**job energy: {energy_text(energy['joules'])}" in text
    # the label cannot open a tag or break the table: escaped, on one line
    assert "<script>" not in text and "\\<script\\>" in text


def test_unknown_job_and_format(api_url: str) -> None:
    response = httpx.get(f"{api_url}/api/jobs/no-such-job/report", timeout=30)
    assert response.status_code == 404
    response = httpx.get(f"{api_url}/api/jobs/no-such-job/report?format=docx", timeout=30)
    assert response.status_code == 400 and response.json()["parameter"] == "format"


def test_a_long_job_is_plotted_from_rollups() -> None:
    """A 24 h job: a few hundred points per series, in steps the 1-minute rollup tiles."""
    step = step_for(86400)
    assert 200 <= 86400 / step <= 400
    assert rollup_for(step) == (60, "metrics_1m")
    assert rollup_for(step_for(30 * 86400)) == (3600, "metrics_1h")


@pytest.fixture(scope="module")
def jobs_api(clickhouse: StackSettings) -> Iterator[str]:
    """An API under JOBSCOPE_READ_POLICY=jobs (the session's is `open`)."""
    name, port = "api-report-policy", ports.port("report-policy")
    try:
        yield services.start_api(
            clickhouse, name=name, port=port, env={"JOBSCOPE_READ_POLICY": "jobs"}
        )
    finally:
        services.process(clickhouse, name).stop(timeout=30)


def test_read_policy_hides_others_jobs(
    jobs_api: str, job: dict[str, Any], stack_settings: StackSettings
) -> None:
    """Under the `jobs` policy the owner reads the report; another user gets the 404 of an
    unknown job, word for word but the id, in every format."""
    secret = secrets.load_or_create(stack_settings.state_dir)["JOBSCOPE_TOKEN_SECRET"]
    owner = create_token(secret, f"rep{job['tag']}-alice", Role.USER, timedelta(hours=1))
    other = create_token(secret, f"rep{job['tag']}-bob", Role.USER, timedelta(hours=1))

    def get(token: str, job_id: str, fmt: str) -> httpx.Response:
        return httpx.get(
            f"{jobs_api}/api/jobs/{job_id}/report",
            params={"format": fmt},
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )

    assert get(owner, job["job_id"], "json").json()["job"]["job_id"] == job["job_id"]
    for fmt in ("html", "pdf", "md", "json"):
        hidden, unknown = get(other, job["job_id"], fmt), get(other, "rep-nothing", fmt)
        assert hidden.status_code == unknown.status_code == 404
        assert hidden.text.replace(job["job_id"], "X") == unknown.text.replace("rep-nothing", "X")
