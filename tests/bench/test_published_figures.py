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
    assert "commit_at_end" not in run


def test_a_run_names_the_commit_it_started_on(tmp_path: Path) -> None:
    """A long run during which the tree moved on is filed under the commit it ran."""
    started = {"sha": "0" * 40, "short": "0000000", "dirty": False, "changed_files": []}
    figures = {"profile": "scale", "only": None, "errors": {}}
    path = results.write(figures, ["--scale"], {"scale": True}, tmp_path, started)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-0000000-scale\.json", path.name)
    run = json.loads(path.read_text())["run"]
    assert run["commit"] == started
    assert run["commit_at_end"]["sha"] == _git("rev-parse", "HEAD")


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


QUICK = "bench/results/2026-11-27-f64a68e+dirty-quick.json"
SCALE = "bench/results/2026-11-27-7a3dec1+dirty-scale.json"
RUNS_PAGE = Path("bench/README.md")


def _runs_block(*paths: str) -> str:
    return f"<!-- bench: runs {','.join(paths)} -->\nanything\n<!-- /bench -->\n"


def _rows(text: str) -> dict[str, list[str]]:
    """A runs block's table rows by key: the cells after the key."""
    rows = re.findall(r"^\| [^|]+ \| `([^`]+)` \| (.+) \|$", text, re.M)
    return {key: cells.split(" | ") for key, cells in rows}


def test_a_runs_block_sets_runs_side_by_side() -> None:
    """A line citing each run, then per part a column per run, the median and the spread; a
    figure one run lacks is n/a there, a part no run holds is left out."""
    quick, scale = publish.Result.load(QUICK), publish.Result.load(SCALE)
    text = publish.render(_runs_block(QUICK, QUICK, SCALE), RUNS_PAGE)
    assert publish.check(RUNS_PAGE, text) == []
    body = text.split("-->\n", 1)[1]
    assert (
        body.count("\n- run ") == 3 and "- run 3: [`2026-11-27-7a3dec1+dirty-scale.json`]" in body
    )
    assert body.count(f"commit `{quick.data['run']['commit']['short']}`") == 2
    assert "| figure | key | run 1 | run 2 | run 3 | median | max/min |" in body
    rows = _rows(body)
    ingest = format(quick.get("ingest_e2e_readings_per_s"), ",.0f")
    assert rows["ingest_e2e_readings_per_s"] == [ingest, ingest, "n/a", ingest, "1.00x"]
    day = format(scale.get("scale_jobscope_1dev_day_1d_s"), ".3f")
    assert rows["scale_jobscope_1dev_day_1d_s"] == ["n/a", "n/a", day, day, "n/a"]
    assert "Scale: a day" in body
    quick_only = publish.render(_runs_block(QUICK, QUICK), RUNS_PAGE)
    assert "Scale: a day" not in quick_only and "Job API:" in quick_only
    assert not any(key.startswith("scale_") for key in _rows(quick_only))


def test_the_median_and_spread_of_runs() -> None:
    """Median of the runs that hold a figure, max/min as the spread, formatted as the figure;
    a figure a single run holds has no spread, and one no run holds no row."""
    run = publish.Result.load(QUICK).data["run"]
    runs = [
        publish.Result(QUICK, {"run": run, **figures})
        for figures in (
            {"freshness_p99_s": 0.5, "bytes_per_reading": 20.0, "api_step_1m_s": 0.2},
            {"freshness_p99_s": 0.7},
            {"freshness_p99_s": 0.6, "bytes_per_reading": 21.4},
        )
    ]
    rows = _rows(publish.render_runs(runs, RUNS_PAGE))
    assert rows == {
        "bytes_per_reading": ["20.00", "n/a", "21.40", "20.70", "1.07x"],
        "freshness_p99_s": ["0.500", "0.700", "0.600", "0.600", "1.40x"],
        "api_step_1m_s": ["0.200", "n/a", "n/a", "0.200", "n/a"],
    }


def test_every_file_of_a_runs_block_is_checked() -> None:
    """Each cited file missing or outside bench/results/ is a problem line of its own, and a
    runs block citing one file is refused."""
    missing = "bench/results/no-such-run.json"
    text = _runs_block(QUICK, missing, "bench-results.json")
    assert publish.check(RUNS_PAGE, text) == [
        f"{RUNS_PAGE}: block runs cites {path}, not a file in bench/results/"
        for path in (missing, "bench-results.json")
    ]
    assert publish.check(RUNS_PAGE, _runs_block(QUICK)) == [
        f"{RUNS_PAGE}: block runs cites 1 file: it needs at least {publish.MIN_RUNS}"
    ]
    two = f"<!-- bench: figures {QUICK},{QUICK} -->\nanything\n<!-- /bench -->\n"
    assert publish.check(RUNS_PAGE, two) == [
        f"{RUNS_PAGE}: block figures cites 2 files: it takes one"
    ]


def test_an_edited_run_figure_is_found() -> None:
    text = publish.render(_runs_block(QUICK, SCALE), RUNS_PAGE)
    edited = re.sub(r"(\| `freshness_p99_s` \| )[\d.]+", r"\g<1>0.001", text)
    assert edited != text
    assert any(
        line.startswith("-") and "0.001" in line for line in publish.check(RUNS_PAGE, edited)
    )


def test_given_files_are_cited_by_block() -> None:
    """`python -m bench.publish A B`: a runs block cites both, a one-file block the last;
    `--block` keeps the others' files; one file where a runs block would cite it is refused."""
    page = _runs_block(SCALE, SCALE) + f"<!-- bench: figures {SCALE} -->\nx\n<!-- /bench -->\n"
    new = publish.render(page, RUNS_PAGE, [SCALE, QUICK])
    assert publish.cited(new) == [("runs", f"{SCALE},{QUICK}"), ("figures", QUICK)]
    only = publish.render(page, RUNS_PAGE, [QUICK, QUICK], {"figures"})
    assert publish.cited(only) == [("runs", f"{SCALE},{SCALE}"), ("figures", QUICK)]
    assert publish.too_few_runs([QUICK], None, [page]) is not None
    assert publish.too_few_runs([QUICK], {"figures"}, [page]) is None
    assert publish.too_few_runs([QUICK], None, [f"<!-- bench: figures {SCALE} -->\n"]) is None
    assert publish.too_few_runs([QUICK, SCALE], None, [page]) is None
    with pytest.raises(SystemExit) as refused:
        publish.main([QUICK, "--block", "runs"])
    assert refused.value.code == 2
