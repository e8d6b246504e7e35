"""Published figures can be checked: every generated block of the docs (bench/publish.py) is
what its cited result file gives, the file is kept in bench/results/, and a run writes such a
file (bench/results.py) naming its commit, profile and machine."""

from __future__ import annotations

import hashlib
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
    options = {"quick": True, "out_dir": tmp_path}
    first = results.write(figures, argv, options, tmp_path, measured=results.commit())
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
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--", ".", ":(exclude)bench/results"],
        cwd=results.REPO_ROOT,
        capture_output=True,
    ).stdout
    assert run["commit"]["diff_sha"] == (hashlib.sha256(diff).hexdigest() if dirty else None)
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


def test_two_dirty_trees_changing_the_same_file_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`diff_sha`: the same changed file, changed two ways, gives two commits; clean, None."""
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "a.py").write_text("one\n")
    subprocess.run([*git, "add", "a.py"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], cwd=tmp_path, check=True)
    monkeypatch.setattr(results, "REPO_ROOT", tmp_path)
    clean = results.commit()
    assert clean["dirty"] is False and clean["diff_sha"] is None
    states = []
    for text in ("two\n", "three\n"):
        (tmp_path / "a.py").write_text(text)
        states.append(results.commit())
    assert [s["changed_files"] for s in states] == [["a.py"], ["a.py"]]
    assert states[0]["diff_sha"] and states[1]["diff_sha"]
    assert states[0] != states[1] and states[0]["diff_sha"] != states[1]["diff_sha"]


GROWTH = "bench/results/2026-11-27-6e8f64d-scale-10dev-1-7d.json"


def test_a_run_the_tree_moved_on_during_is_cited_with_both_commits() -> None:
    """The file's `commit_at_end` is in its citing line; a run without one has none."""
    line = publish.cite(publish.Result.load(GROWTH), RUNS_PAGE)
    assert "commit `6e8f64d` (the tree was at `1e58738` when it ended)," in line
    assert "the tree was at" not in publish.cite(publish.Result.load(QUICK), RUNS_PAGE)


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


def _quick_runs() -> list[publish.Result]:
    """Three runs of QUICK's profile: its file, one with another ingest figure, one without
    the freshness figures."""
    data = publish.Result.load(QUICK).data
    other = {**data, "ingest_e2e_readings_per_s": 2 * data["ingest_e2e_readings_per_s"]}
    lacking = {k: v for k, v in data.items() if not k.startswith("freshness_")}
    return [
        publish.Result(path, figures)
        for path, figures in (
            (QUICK, data),
            ("bench/results/2026-11-28-0000000-quick.json", other),
            ("bench/results/2026-11-29-0000000-quick.json", lacking),
        )
    ]


def test_a_runs_block_sets_runs_side_by_side() -> None:
    """A line citing each run, then per part a column per run, the median and the spread; a
    figure one run lacks is n/a there, a part no run holds is left out."""
    runs = _quick_runs()
    body = publish.render_runs(runs, RUNS_PAGE)
    assert body.count("\n- run ") == 3 and "- run 3: [`2026-11-29-0000000-quick.json`]" in body
    assert body.count(f"commit `{runs[0].data['run']['commit']['short']}`") == 3
    assert "| figure | key | run 1 | run 2 | run 3 | median | max/min |" in body
    rows = _rows(body)
    ingest = runs[0].get("ingest_e2e_readings_per_s")
    one, two = format(ingest, ",.0f"), format(2 * ingest, ",.0f")
    assert rows["ingest_e2e_readings_per_s"] == [one, two, one, one, "2.00x"]
    p99 = format(runs[0].get("freshness_p99_s"), ".3f")
    assert rows["freshness_p99_s"] == [p99, p99, "n/a", p99, "1.00x"]
    assert "Scale: a day" not in body and "Job API:" in body
    assert not any(key.startswith("scale_") for key in rows)


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


def test_every_file_of_a_runs_block_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cited file missing or outside bench/results/ is a problem line of its own; a runs
    block citing too few files (the count said), one file twice, or runs of different
    profiles is refused."""
    missing = "bench/results/no-such-run.json"
    text = _runs_block(QUICK, missing, "bench-results.json")
    assert publish.check(RUNS_PAGE, text) == [
        f"{RUNS_PAGE}: block runs cites {path}, not a file in bench/results/"
        for path in (missing, "bench-results.json")
    ]
    assert publish.check(RUNS_PAGE, _runs_block(QUICK)) == [
        f"{RUNS_PAGE}: block runs cites 1 file: it needs at least {publish.MIN_RUNS}"
    ]
    assert publish.check(RUNS_PAGE, _runs_block(QUICK, SCALE, QUICK)) == [
        f"{RUNS_PAGE}: block runs cites {QUICK} more than once: each run once"
    ]
    assert publish.check(RUNS_PAGE, _runs_block(QUICK, SCALE)) == [
        f"{RUNS_PAGE}: block runs cites runs of profiles quick, scale: its spread is run to run "
        "of one profile"
    ]
    with pytest.raises(ValueError, match="profiles quick, scale"):
        publish.render(_runs_block(QUICK, SCALE), RUNS_PAGE)
    two = f"<!-- bench: figures {QUICK},{QUICK} -->\nanything\n<!-- /bench -->\n"
    assert publish.check(RUNS_PAGE, two) == [
        f"{RUNS_PAGE}: block figures cites 2 files: it takes one"
    ]
    monkeypatch.setattr(publish, "MIN_RUNS", 3)
    assert publish._count_problem("runs", [QUICK, SCALE]) == (
        "block runs cites 2 files: it needs at least 3"
    )


def test_runs_of_one_profile_may_be_cited() -> None:
    assert publish._profile_problem("runs", _quick_runs()) is None
    assert publish._count_problem("runs", [r.path for r in _quick_runs()]) is None
    mixed = [*_quick_runs(), publish.Result.load(SCALE)]
    assert publish._profile_problem("runs", mixed) == (
        "block runs cites runs of profiles quick, scale: its spread is run to run of one profile"
    )
    assert publish._profile_problem("figures", mixed) is None


@pytest.fixture
def kept_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """_quick_runs() as files of a results folder (tmp_path, standing for bench/results/)."""
    monkeypatch.setattr(publish, "RESULTS_DIR", tmp_path)
    paths = []
    for run in _quick_runs():
        path = tmp_path / Path(run.path).name
        path.write_text(json.dumps(run.data))
        paths.append(str(path))
    return paths


def test_an_edited_run_figure_is_found(kept_runs: list[str]) -> None:
    text = publish.render(_runs_block(*kept_runs), RUNS_PAGE)
    assert publish.check(RUNS_PAGE, text) == []
    edited = re.sub(r"(\| `freshness_p99_s` \| )[\d.]+", r"\g<1>0.001", text)
    assert edited != text
    assert any(
        line.startswith("-") and "0.001" in line for line in publish.check(RUNS_PAGE, edited)
    )


def test_given_files_are_cited_by_block(kept_runs: list[str]) -> None:
    """`python -m bench.publish A B`: a runs block cites both, a one-file block the last;
    `--block` keeps the others' files; one file where a runs block would cite it is refused,
    and several where none would."""
    a, b, c = kept_runs
    page = _runs_block(a, b) + f"<!-- bench: figures {SCALE} -->\nx\n<!-- /bench -->\n"
    new = publish.render(page, RUNS_PAGE, [b, c])
    assert publish.cited(new) == [("runs", f"{b},{c}"), ("figures", c)]
    only = publish.render(page, RUNS_PAGE, [QUICK], {"figures"})
    assert publish.cited(only) == [("runs", f"{a},{b}"), ("figures", QUICK)]
    assert publish.too_few_runs([QUICK], None, [page]) is not None
    assert publish.too_few_runs([QUICK], {"figures"}, [page]) is None
    assert publish.too_few_runs([QUICK], None, [f"<!-- bench: figures {SCALE} -->\n"]) is None
    assert publish.too_few_runs([QUICK, SCALE], None, [page]) is None
    assert publish.no_runs_block([a, b], None, [page]) is None
    assert publish.no_runs_block([a, b], {"runs"}, [page]) is None
    assert publish.no_runs_block([a], {"figures"}, [page]) is None
    assert publish.no_runs_block([a, b], {"figures"}, [page]) == NO_RUNS_BLOCK
    assert publish.no_runs_block([a, b], None, [f"<!-- bench: figures {SCALE} -->\n"]) == (
        NO_RUNS_BLOCK
    )


NO_RUNS_BLOCK = (
    "2 result files given, but no block rendered is a runs block (none on the pages, or "
    "--block leaves it out): the others cite one file, give only that"
)


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """`python -m bench.publish ARGV`'s parser error: its message."""
    with pytest.raises(SystemExit) as refused:
        publish.main(list(argv))
    assert refused.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_main_refuses_what_no_block_can_cite(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too few files for a runs block, several where no runs block is rendered, a file given
    twice or runs of different profiles: a parser error, nothing written (the pages are a
    page of the test's, so that a failing refusal writes nothing of the repository's)."""
    prog = "python -m bench.publish: error: "
    page = tmp_path / "page.md"
    page.write_text(f"<!-- bench: figures {SCALE} -->\nx\n<!-- /bench -->\n")
    monkeypatch.setattr(publish, "pages", lambda: [page])
    assert _refused(capsys, QUICK, "--block", "runs") == prog + (
        "a runs block cites at least 2 result files: give them all, or name the other blocks "
        "with --block"
    )
    assert _refused(capsys, QUICK, GROWTH) == prog + NO_RUNS_BLOCK
    page.write_text(_runs_block(QUICK, GROWTH) + page.read_text())
    assert _refused(capsys, QUICK, GROWTH, "--block", "figures") == prog + NO_RUNS_BLOCK
    assert _refused(capsys, QUICK, GROWTH) == prog + (
        "block runs cites runs of profiles quick, scale-10dev-1-7d: its spread is run to run of "
        "one profile"
    )
    assert _refused(capsys, GROWTH, GROWTH) == prog + (
        f"block runs cites {GROWTH} more than once: each run once"
    )


def test_goals_are_judged_on_the_cited_run() -> None:
    """Each goal with its figure, bound and verdict; the worst shape named; a goal whose
    figure the run lacks is left out."""
    run = publish.Result.load(QUICK).data["run"]
    result = publish.Result(
        QUICK,
        {
            "run": run,
            "ingest_e2e_readings_per_s": 900.0,
            "peer_victoriametrics_ingest_readings_per_s": 500.0,
            "queries_s": {
                "jobscope": {"a": 0.01, "b": 0.1},
                "peer_postgres": {"a": 0.1, "b": 0.2},
                "peer_victoriametrics": {"a": 0.005, "b": 0.3},
            },
            "systems": {"jobscope": {"api_step_server_s": 0.06}},
        },
    )
    text = publish.render_goals(result, Path("bench/README.md"))
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if "|" in line}
    assert (
        "| 1.8 | >= 1.5 | met |"
        in rows["ingest readings/s end to end, jobscope over VictoriaMetrics"]
    )
    pg = rows["job queries through the API, time of PostgreSQL over jobscope's, worst shape"]
    assert "| 2 (`b`) | >= 5 | not met |" in pg
    vm = rows["job queries through the API, time of VictoriaMetrics over jobscope's, worst shape"]
    assert "| 0.5 (`a`) | >= 1.5 | not met |" in vm
    step = next(v for k, v in rows.items() if k.startswith("`step=1m`"))
    assert "| 0.06 | <= 0.05 | not met |" in step
    assert not any("CPU" in k or "Prometheus" in k for k in rows)


def test_scale_shapes_are_compared_level_by_level() -> None:
    result = _result(
        scale_jobscope_1dev_1min_7d_s=0.02,
        scale_postgres_1dev_1min_7d_s=0.2,
        scale_postgres_1dev_1min_1d_s=0.001,
        scale_jobscope_summary_7d_s=9.0,
    )
    assert publish.shape_times(result) == {
        "jobscope": {"1dev_1min@7d": 0.02},
        "postgres": {"1dev_1min@7d": 0.2, "1dev_1min@1d": 0.001},
    }
    assert publish.worst_speedup(result, "postgres") == (10.0, "1dev_1min@7d")
    assert publish.worst_speedup(result, "victoriametrics") is None
