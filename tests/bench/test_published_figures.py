"""Published figures can be checked: every generated block of the docs (bench/publish.py) is
what its cited result file gives, the file is kept in bench/results/, and a run writes such a
file (bench/results.py) naming its commit, profile and machine."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench import publish, results
from bench.machine import describe

# The pages whose figures the issue found unchecked: each must hold a generated block.
PUBLISHED = {Path("docs/kubernetes.md"): "sizing", Path("bench/README.md"): "figures"}


def test_every_block_is_what_its_file_gives() -> None:
    pages = {
        page: publish.cited((publish.REPO_ROOT / page).read_text()) for page in publish.pages()
    }
    for page, block in PUBLISHED.items():
        assert block in [name for name, _ in pages[page]], f"{page} has no `{block}` block"
    problems = [line for page, blocks in pages.items() if blocks for line in publish.check(page)]
    assert not problems, "\n".join(problems) + "\n(python -m bench.publish regenerates them)"


def test_an_edited_figure_is_found() -> None:
    """The check can fail: one figure of the sizing table changed by hand."""
    page = Path("docs/kubernetes.md")
    text = (publish.REPO_ROOT / page).read_text()
    row = re.search(
        r"^\| SNMP OIDs per core-second \| `snmp_oids_per_core_s` \| ([\d,]+) \|$", text, re.M
    )
    assert row, "the sizing table has no SNMP row"
    edited = text.replace(row[0], row[0].replace(row[1], "96,112"))
    assert edited != text
    diff = publish.check(page, edited)
    assert any(line.startswith("-") and "96,112" in line for line in diff), diff


def test_the_helm_example_holds_the_sizing() -> None:
    """The large-site values' producer shards and partitions are the sizing's, and an edited
    count is found."""
    assert publish.check_helm_example() == [], "python -m bench.publish regenerates them"
    text, rendered = publish.helm_example_rendered()
    shards = re.search(r"^producers:\n(?:.*\n)*?  shards: (\d+)$", text, re.M)
    assert shards, "no producers.shards line"
    edited = text.replace(shards[0], shards[0].replace(f"shards: {shards[1]}", "shards: 8"))
    assert edited != text and publish.render_helm_example(edited, cited_sizing()) == rendered


def cited_sizing() -> publish.Result:
    page = (publish.REPO_ROOT / publish.SIZING_PAGE).read_text()
    return publish.Result.load(next(f for name, f in publish.cited(page) if name == "sizing"))


def test_a_cited_file_must_be_a_kept_result() -> None:
    page = Path("docs/kubernetes.md")
    for path in ("bench-results.json", "bench/results/no-such-run.json"):
        text = f"<!-- bench: sizing {path} -->\nanything\n<!-- /bench -->\n"
        assert publish.check(page, text) == [
            f"{page}: block sizing cites {path}, not a file in bench/results/"
        ]


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=results.REPO_ROOT, capture_output=True, text=True)
    return done.stdout.strip()


def test_a_run_writes_its_result_file(tmp_path: Path) -> None:
    """Name, commit, profile, command, versions and the machine, and never over another run."""
    figures = {
        "profile": "quick",
        "only": ["snmp", "ipmi"],
        "snmp_oids_per_core_s": 1.0,
        "snmp_polling": {"versions": {"snmpd": "5.9.3", "snmp_exporter": "0.21.0"}},
        "systems": {"postgres": {"version": "15.8"}},
        "machine": describe(),
        "errors": {},
    }
    argv = ["--quick", "--only", "snmp,ipmi"]
    first = results.write(figures, argv, {"quick": True, "out_dir": tmp_path}, tmp_path)
    second = results.write(figures, argv, {"quick": True}, tmp_path)
    sha = _git("rev-parse", "HEAD")
    assert re.fullmatch(
        rf"\d{{4}}-\d\d-\d\d-{sha[:7]}(\+dirty)?-quick-ipmi\+snmp\.json", first.name
    )
    assert second.name == first.name.removesuffix(".json") + "-2.json"
    kept = json.loads(first.read_text())
    run = kept["run"]
    assert run["commit"]["sha"] == sha
    dirty = _git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
    assert run["commit"]["dirty"] is bool(dirty)
    assert run["command"] == "python -m bench --quick --only snmp,ipmi"
    assert run["options"]["out_dir"] == str(tmp_path)
    assert run["versions"] == {"postgres": "15.8", "snmp_exporter": "0.21.0", "snmpd": "5.9.3"}
    assert kept["snmp_oids_per_core_s"] == 1.0
    assert kept["machine"]["cpu_count"] >= 1 and kept["machine"]["memory_total_bytes"] > 0
    assert kept["machine"]["cpu_model"] and kept["machine"]["kernel"]


def _result(**figures: object) -> publish.Result:
    return publish.Result("bench/results/x.json", {"run": {}, **figures})


def test_the_sizing_formula() -> None:
    """The worked example as it was computed by hand before (docs/kubernetes.md of 2026-11-23),
    from that day's figures: 4 ClickHouse shards, 24 partitions, 3 API replicas; 6.42 producer
    cores / 0.8 = 8.03 processes, which the hand rounded down to 8 shards: 9 hold them."""
    result = _result(
        snmp_oids_per_core_s=96_112,
        ipmi_sensors_per_core_s=2_896,
        prometheus_samples_per_core_s=288_260,
        api_small_queries_per_s=35,
        rollup_cpu_us_per_reading=1.9,
        systems={
            "jobscope": {"ingest_detail": {"cpu_us_per_reading_by_process": {"clickhouse": 1.8}}}
        },
    )
    s = publish.sizing(result)
    assert s["readings_per_s"] == 532_200
    assert s["producer_cores"] == pytest.approx(6.42, abs=0.005)
    assert s["producer_shards"] == 9
    assert s["clickhouse_us_per_reading"] == pytest.approx(3.7)
    assert s["clickhouse_needed"] == pytest.approx(532_200 / 270_270, rel=1e-3)
    assert (s["clickhouse_shards"], s["partitions"]) == (4, 24)
    assert s["api_min_replicas"] == 3
    missing = publish.sizing(_result(snmp_oids_per_core_s=96_112))
    assert missing["producer_shards"] is None and "clickhouse_shards" not in missing
    assert missing["api_min_replicas"] is None
