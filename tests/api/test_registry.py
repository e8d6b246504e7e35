"""The metric registry (api/registry.py): broken files are refused naming file, line and
field; lookups go exact, then pattern, then inferred; the shipped file describes the metrics
jobscope's producers make; the API serves it, merges it into every catalog, and refuses to
start on a broken file (a real process)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from clickhouse_connect.driver.client import Client

from api.registry import SHIPPED, Kind, Registry, RegistryError, infer, load, unit_sql
from api.registry import main as registry_main
from jobscope.cli import cli
from stack import services
from stack.config import REPO_ROOT, StackSettings
from tests.api.conftest import Row

GOOD = """\
energy_priority: [wattmeter, bmc]
metrics:
  - name: node_power_watt
    unit: W
    kind: gauge
    scope: node
    energy_role: bmc
    idle: 100
    peak: 400
    description: power of the node
  - name: bmc_*_temp_celsius
    unit: Cel
    kind: gauge
    scope: device
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"registry-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("broken", "line", "field", "problem"),
    [
        (
            GOOD.replace("kind: gauge\n    scope: node", "kind: gage\n    scope: node"),
            5,
            "metrics[node_power_watt].kind",
            "gauge",
        ),
        (
            GOOD.replace("    unit: Cel\n", "    unti: Cel\n"),
            12,
            "metrics[bmc_*_temp_celsius].unti",
            "Extra inputs",
        ),
        (GOOD.replace("    unit: Cel\n", ""), 11, "metrics[bmc_*_temp_celsius].unit", "required"),
        (GOOD.replace("peak: 400", "peak: 50"), 3, "metrics[node_power_watt]", "below peak"),
        (GOOD.replace("idle: 100", "idle: lots"), 8, "metrics[node_power_watt].idle", "number"),
        (GOOD.replace("[wattmeter, bmc]", "[wattmeter, sun]"), 1, "energy_priority[1]", "'bmc'"),
        (
            GOOD.replace("energy_role: bmc", "energy_role: bmc\n    unit: J"),
            8,
            "metrics[node_power_watt].unit",
            "given twice",
        ),
        (GOOD.replace("bmc_*_temp_celsius", "node_power_watt"), 1, "(file)", "two entries"),
        (
            GOOD.replace("    scope: device\n", "    scope: [device\n"),
            15,
            "(yaml)",
            "sequence at line 14",
        ),
        ("- just a list\n", 1, "(file)", "a mapping"),
    ],
)
def test_a_broken_file_is_refused_naming_file_line_and_field(
    tmp_path: Path, broken: str, line: int, field: str, problem: str
) -> None:
    path = write(tmp_path, broken)
    with pytest.raises(RegistryError) as caught:
        load(path)
    lines = str(caught.value).splitlines()
    prefix = f"{path}:{line}: {field}: "
    assert any(x.startswith(prefix) and problem in x for x in lines), lines


def test_a_good_file_loads(tmp_path: Path) -> None:
    reg = load(write(tmp_path, GOOD))
    assert reg.energy_priority == ["wattmeter", "bmc"]
    assert reg.lookup("node_power_watt").idle == 100


def test_a_registry_file_is_plain_data(tmp_path: Path) -> None:
    """A registry is a site file like the note rules: no YAML tag (not even a safe one) is
    constructed, no alias bomb is expanded, no file past the size bound is read."""
    marker = tmp_path / "pwned"
    tagged = GOOD.replace(
        "metrics:", f"metrics: !!python/object/apply:os.system ['touch {marker}']"
    )
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n'
    huge = GOOD + "# " + "x" * (256 * 1024) + "\n"
    for text, refusal in (
        (tagged, "2: (yaml): tags are not accepted"),
        ("energy_priority: !!str bmc\n", "1: (yaml): tags are not accepted"),
        (bomb + GOOD, "1: (yaml): anchors and aliases are not accepted"),
        (huge, "0: (file): larger than"),
    ):
        path = write(tmp_path, text)
        with pytest.raises(RegistryError) as caught:
            load(path)
        assert str(caught.value).startswith(f"{path}:{refusal}"), caught.value
    assert not marker.exists()


def test_lookup_exact_then_pattern_then_inferred() -> None:
    reg = Registry.model_validate(
        {
            "metrics": [
                {"name": "bmc_*", "unit": "1", "kind": "gauge", "scope": "device"},
                {"name": "bmc_cpu_temp_celsius", "unit": "Cel", "kind": "gauge", "scope": "socket"},
                {"name": "bmc_*_celsius", "unit": "Cel", "kind": "gauge", "scope": "node"},
                {"name": "node_load1", "unit": "1", "kind": "gauge", "scope": "node"},
            ]
        }
    )
    assert reg.lookup("bmc_cpu_temp_celsius").scope == "socket"  # exact beats a pattern before it
    assert reg.lookup("bmc_dimm_temp_celsius").name == "bmc_*"  # patterns: first in file order
    assert reg.lookup("prom_node_load1").name == "node_load1"  # Kwollect's prom_ prefix
    unknown = reg.lookup("switch_port_joules_total")
    assert unknown.inferred and unknown.kind == Kind.ENERGY_COUNTER and unknown.unit == "J"
    assert unknown.energy_role is None
    assert not reg.lookup("bmc_x").inferred


@pytest.mark.parametrize(
    ("metric", "unit", "kind"),
    [
        ("a_watt", "W", Kind.GAUGE),
        ("a_joules_total", "J", Kind.ENERGY_COUNTER),
        ("a_joule", "J", Kind.ENERGY_COUNTER),
        ("a_bytes_total", "B", Kind.COUNTER),
        ("a_packets_total", "1", Kind.COUNTER),
        ("a_celsius", "Cel", Kind.GAUGE),
        ("a_percent", "%", Kind.GAUGE),
        ("a_ratio", "1", Kind.GAUGE),
        ("whatever", "1", Kind.GAUGE),
    ],
)
def test_inferred_defaults_follow_the_suffix(metric: str, unit: str, kind: Kind) -> None:
    info = infer(metric)
    assert (info.unit, info.kind, info.inferred, info.name) == (unit, kind, True, metric)


PRODUCED = [
    # producers/config/demo.yaml (the demo fleet), producers/config/sample/*.yaml, the plugins'
    # sample.yaml, Kwollect's names
    "bmc_power_watt",
    "pdu_outlet_power_watt",
    "tester_value_07",
    "tester_extra_3",
    "tester_power_watt",
    "wattmetre_power_watt",
    "bmc_node_power_watt",
    "bmc_cpu_temp_celsius",
    "bmc_ambient_temp_celsius",
    "bmc_exhaust_temp_celsius",
    "bmc_fan_speed_rpm",
    "bmc_psu_voltage_volt",
    "bmc_psu_current_milliamp",
    "pdu_power_watt",
    "pdu_outlet_energy_kwh_total",
    "pdu_inlet_voltage_volt",
    "pdu_inlet_current_amp",
    "network_ifacein_bytes_total",
    "network_ifaceout_bytes_total",
    "network_ifacein_32_bytes_total",
    "agent_uptime_centiseconds",
    "prom_node_load1",
    "prom_node_cpu_seconds_total",
    "prom_node_network_receive_bytes_total",
    "node_memory_MemAvailable_bytes",
    "node_rapl_package_joules_total",
    "DCGM_FI_DEV_GPU_UTIL",
    "prom_DCGM_FI_DEV_POWER_USAGE",
    "job_progress_ratio",
    "job_gpu_power_watt",
    # producers/plugins/nvidiasmi/
    "gpu_power_watt",
    "gpu_energy_joules_total",
    "gpu_power_limit_watt",
    "gpu_utilization_percent",
    "gpu_memory_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_temp_celsius",
    "gpu_memory_temp_celsius",
    "gpu_sm_clock_hertz",
    "gpu_clocks_event_reasons",
    # producers/plugins/prometheus/exporters/
    "cpu_energy_joules_total",
    "memory_energy_joules_total",
]


def test_the_shipped_registry_describes_what_jobscope_produces() -> None:
    reg = load(SHIPPED)
    missing = [m for m in PRODUCED if reg.lookup(m).inferred]
    assert missing == []
    assert reg.energy_priority[0] == "wattmeter"
    roles = {m.energy_role for m in reg.metrics}
    assert {"bmc", "pdu", "wattmeter", "rapl", "gpu"} <= roles
    assert reg.lookup("prom_node_rapl_dram_joules_total").kind == Kind.ENERGY_COUNTER
    assert reg.lookup("network_ifacein_32_bytes_total").counter_bits == 32
    assert any(m.key for m in reg.metrics)
    demo = (REPO_ROOT / "producers/config/demo.yaml").read_text()
    for name in ("bmc_power_watt", "pdu_outlet_power_watt"):
        assert f"name: {name}," in demo and not reg.lookup(name).inferred


def test_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = write(tmp_path, GOOD.replace("kind: gauge", "kind: nope", 1))
    assert registry_main(["check", str(SHIPPED)]) == 0
    assert registry_main(["check", str(broken)]) == 1
    assert f"{broken}:5: metrics[node_power_watt].kind" in capsys.readouterr().err


def get(api_url: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{api_url}{path}", params=params, timeout=30)


def test_the_api_serves_the_registry(api_url: str) -> None:
    whole = get(api_url, "/api/metrics/registry")
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert body["energy_priority"] == load(SHIPPED).energy_priority
    names = {m["name"]: m for m in body["metrics"]}
    assert names["wattmetre_power_watt"]["energy_role"] == "wattmeter"
    exact = get(api_url, "/api/metrics/registry", metric="bmc_node_power_watt").json()
    assert (exact["name"], exact["unit"], exact["inferred"]) == ("bmc_node_power_watt", "W", False)
    pattern = get(api_url, "/api/metrics/registry", metric="tester_value_12").json()
    assert pattern["name"] == "tester_value_*" and not pattern["inferred"]
    guessed = get(api_url, "/api/metrics/registry", metric="my_gpu_celsius").json()
    assert guessed["inferred"] and guessed["unit"] == "Cel" and guessed["name"] == "my_gpu_celsius"
    long = get(api_url, "/api/metrics/registry", metric="x" * 300)
    assert long.status_code in (400, 422)
    empty = get(api_url, "/api/metrics/registry", metric="")  # found by the fuzzer: was a 500
    assert empty.status_code == 400, empty.text


def test_the_cli_prints_the_registry(api_url: str) -> None:
    wide = {"COLUMNS": "200"}
    whole = CliRunner().invoke(cli, ["--api", api_url, "registry"], env=wide)
    assert whole.exit_code == 0, whole.output
    assert "energy priority: wattmeter, pdu, bmc" in whole.output
    assert "wattmetre_power_watt" in whole.output
    one = CliRunner().invoke(cli, ["--api", api_url, "registry", "odd_thing_celsius"], env=wide)
    assert one.exit_code == 0, one.output
    assert "Cel" in one.output and "inferred" in one.output and "True" in one.output


START = datetime(2026, 11, 21, 8, 0, 0)


def test_every_catalog_carries_the_registry(
    api_url: str,
    insert_readings: Callable[[list[Row]], None],
    post_job: Callable[..., dict[str, Any]],
) -> None:
    p = f"rg{uuid.uuid4().hex[:6]}"
    node, pdu = f"{p}-node-1", f"{p}-pdu"
    rows: list[Row] = []
    for i in range(11):
        t = START + timedelta(seconds=i)
        rows += [[t, node, "bmc_power_watt", 200.0, {}], [t, node, "mystery_celsius", 40.0, {}]]
        rows += [[t, pdu, "pdu_outlet_power_watt", 210.0, {"_device_alias": node}]]
    insert_readings(rows)
    job_id = f"{p}_1"
    post_job(
        job_id=job_id,
        user="alice",
        nodes=node,
        start=START.isoformat() + "Z",
        end=(START + timedelta(seconds=10)).isoformat() + "Z",
        state="terminated",
    )
    catalog = get(api_url, f"/api/jobs/{job_id}/catalog").json()
    by = {(c["device_id"], c["metric_id"]): c for c in catalog}
    power = by[(node, "bmc_power_watt")]
    assert (power["unit"], power["kind"], power["scope"], power["inferred"]) == (
        "W",
        "gauge",
        "node",
        False,
    )
    assert power["count"] == 11 and power["description"]
    mystery = by[(node, "mystery_celsius")]
    assert mystery["inferred"] and mystery["unit"] == "Cel"
    assert by[(node, "pdu_outlet_power_watt")]["scope"] == "outlet"
    at = (START + timedelta(seconds=10)).isoformat()
    available = get(
        api_url, "/rpc/available_metrics", at=at, params=f'{{"job_id": "{job_id}"}}'
    ).json()
    kinds = {(a["device_id"], a["metric_id"]): (a["unit"], a["inferred"]) for a in available}
    assert kinds[(node, "bmc_power_watt")] == ("W", False)
    assert kinds[(node, "mystery_celsius")] == ("Cel", True)


def test_the_api_refuses_to_start_with_a_broken_registry(
    clickhouse: StackSettings, tmp_path: Path
) -> None:
    """`python -m api` stops at once (exit 2), naming file, line and field on stderr."""
    broken = write(tmp_path, GOOD.replace("unit: W", "unit: W\n    colour: red"))
    env = {
        **services.component_env(clickhouse),
        "JOBSCOPE_API_PORT": "1",
        "JOBSCOPE_METRIC_REGISTRY": str(broken),
    }
    done = subprocess.run(
        [sys.executable, "-m", "api"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "invalid metric registry" in done.stderr
    assert f"{broken}:5: metrics[node_power_watt].colour: Extra inputs" in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "api"],
        env={**env, "JOBSCOPE_METRIC_REGISTRY": str(tmp_path / "absent.yaml")},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "absent.yaml:0: (file)" in missing.stderr


def _named_by(pattern: str) -> str:
    """A name an fnmatch pattern matches: * as x, ? as y, a class as its first member."""
    name = pattern.replace("*", "x").replace("?", "y")
    return re.sub(
        r"\[!?([^\]])[^\]]*\]", lambda m: m.group(1) if "!" not in m.group(0) else "~", name
    )


def test_the_units_in_sql_are_the_lookups(reader_client: Client) -> None:
    """unit_sql (Superset's datasets' units) gives each name the unit `lookup` gives, in the
    real engine: the shipped entries, names their patterns match, prom_ names, suffixes,
    unknown names; and a hostile registry (quotes, backslashes, Jinja braces, regex
    characters in names) stays literal."""
    hostile = Registry.model_validate(
        {
            "metrics": [
                {"name": "o'neil\\{{ x }}", "unit": "{it's}", "kind": "gauge", "scope": "node"},
                {"name": "a.b+c_[0-3]?*", "unit": "A", "kind": "gauge", "scope": "node"},
                {"name": "z_[!a-c]", "unit": "Z", "kind": "gauge", "scope": "node"},
            ]
        }
    )
    for reg in (load(SHIPPED), hostile):
        names = [e.name if not e.is_pattern else _named_by(e.name) for e in reg.metrics]
        names += [f"prom_{n}" for n in names] + ["prom_", "axb_c0yq", "z_a", "z_d"]
        names += ["a_watt", "A_WATTS", "x_joules_total", "x_bytes_total", "x_rpm", "unknown"]
        sql = unit_sql(reg, "name")
        got = reader_client.query(
            f"SELECT name, {sql} FROM (SELECT arrayJoin({{names:Array(String)}}) AS name)",
            parameters={"names": names},
        ).result_rows
        assert {n: u for n, u in got} == {n: reg.lookup(n).unit for n in names}
    assert "{{" not in unit_sql(hostile) and "{%" not in unit_sql(hostile)
