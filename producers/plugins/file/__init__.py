"""Values users push as Prometheus textfiles (see README.md)."""
