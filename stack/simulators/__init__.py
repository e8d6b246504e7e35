"""Real device simulators (SNMP agents, BMCs) for tests, benchmarks and `make up`."""
