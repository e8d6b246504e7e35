"""Polling benchmarks: jobscope's producers beside other collectors, on real devices.

Each module has `measure(state_dir, quick) -> dict` whose keys go at the top level of
bench-results.json: `snmp.py` (SNMP agents), `ipmi.py` (BMCs).
"""
