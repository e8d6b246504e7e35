"""The demo fleet polled by `make up` (producers/config/demo.yaml), generated here:
`python -m producers.demo_fleet > producers/config/demo.yaml`; a test checks the file is
what this prints.

50 simulated nodes, each with 20 `tester_value_NN` metrics, a `bmc_power_watt` and a byte
counter `node_network_receive_bytes_total` (so a job's summary has a counter's delta and
rate); 5 PDUs whose 10 outlets each power one node (`_device_alias`), so a job on demo nodes
has power from two sources and energy to sum. Every second: 1,150 readings.

On demand (`POST /api/jobs/{id}/on-demand`), for a job's nodes: 5 `tester_extra_N` metrics
each (optional entries), and their outlets' power every 100 ms instead of every second
(`optional_period`, as a wattmeter's full monitoring).
"""

from __future__ import annotations

NODES = 50
PDUS = 5
OUTLETS = NODES // PDUS
HEADER = (
    "# The demo fleet polled by `make up`: 50 simulated nodes (20 metrics, a BMC power\n"
    "# reading and a byte counter each) and 5 PDUs whose outlets power them\n"
    "# (`_device_alias`), every second;\n"
    "# on demand, for a job's nodes: tester_extra metrics, and their outlets every 100 ms.\n"
    "# Generated, do not edit by hand; regenerate with\n"
    "#   python -m producers.demo_fleet > producers/config/demo.yaml\n"
)


def demo_fleet() -> str:
    lines = [HEADER]
    for i in range(1, NODES + 1):
        node = f"{{device_id: node-{i}, update_every: 1000"
        lines.append(
            f'- {{name: tester_value, {node[1:]}, url: "tester://?metrics=20", '
            "labels: {source: tester}}\n"
        )
        lines.append(f'- {{name: bmc_power_watt, {node[1:]}, url: "tester://"}}\n')
        lines.append(
            f"- {{name: node_network_receive_bytes_total, {node[1:]}, "
            'url: "tester://?counter=1", scale_factor: 1000}\n'
        )
        lines.append(
            f'- {{name: tester_extra, {node[1:]}, url: "tester://?metrics=5", optional: true}}\n'
        )
    for p in range(1, PDUS + 1):
        for outlet in range(1, OUTLETS + 1):
            node = (p - 1) * OUTLETS + outlet
            lines.append(
                f"- {{name: pdu_outlet_power_watt, device_id: pdu-{p}, update_every: 1000, "
                f'optional_period: 100, url: "tester://", '
                f'labels: {{outlet: "{outlet}", _device_alias: node-{node}}}}}\n'
            )
    return "".join(lines)


if __name__ == "__main__":
    print(demo_fleet(), end="")
