"""`jobscope report`, run as a subprocess against the real API: the format from -o's suffix
or --format, stdout without -o, the PDF's text holding the job's energy."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pypdf

from jobscope.client import Client
from tests.client.conftest import Scenario
from tests.client.test_cli import run


def _energy_text(api_url: str, job_id: str) -> str:
    """The energy line's figure as the API's JSON report gives it."""
    report = json.loads(Client(api_url).report(job_id, "json"))
    joules = report["energy"]["joules"]
    return f"{round(joules):,} J"


def test_report_pdf_from_the_suffix(api_url: str, scenario: Scenario, tmp_path: Path) -> None:
    out = tmp_path / "report.pdf"
    done = run(api_url, "report", scenario.job_id, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"" and b"written to" in done.stderr
    assert out.read_bytes().startswith(b"%PDF-")
    reader = pypdf.PdfReader(io.BytesIO(out.read_bytes()))
    text = "".join(page.extract_text() for page in reader.pages)
    assert scenario.job_id in text and _energy_text(api_url, scenario.job_id) in text


def test_report_formats(api_url: str, scenario: Scenario, tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    assert run(api_url, "report", scenario.job_id, "-o", str(html)).returncode == 0
    assert html.read_text().startswith("<!DOCTYPE html>")
    md = tmp_path / "r.md"
    assert run(api_url, "report", scenario.job_id, "-o", str(md)).returncode == 0
    assert md.read_text().startswith(f"# jobscope report: job {scenario.job_id}")
    done = run(api_url, "report", scenario.job_id, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["job"]["job_id"] == scenario.job_id
    done = run(api_url, "report", scenario.job_id)  # stdout, HTML
    assert done.stdout.startswith(b"<!DOCTYPE html>")


def test_report_errors_are_one_line(api_url: str, scenario: Scenario, tmp_path: Path) -> None:
    done = run(api_url, "report", "no-such-job-at-all", "-o", str(tmp_path / "x.pdf"))
    assert done.returncode == 1 and done.stderr.decode().count("\n") == 1
    assert b"404" in done.stderr and not (tmp_path / "x.pdf").exists()
    done = run(api_url, "report", scenario.job_id, "-o", str(tmp_path / "x.docx"))
    assert done.returncode == 2 and b"--format" in done.stderr
