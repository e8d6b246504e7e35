"""Benchmarks of jobscope beside its peers (VictoriaMetrics, PostgreSQL): `python -m bench`."""
