"""Polling benchmarks: jobscope's producers beside other collectors, on real devices.

Each module has `measure(state_dir, quick, stack) -> dict` whose keys go at the top level of
bench-results.json: `snmp.py` (SNMP agents), `ipmi.py` (BMCs), `prometheus.py`,
`wattmeter.py`, `ondemand.py`, `live.py`, `remote_write.py`. `stack` is the run's one
`producer.PollingStack`: a module asks it for the parts it needs and stops what it starts.
"""
