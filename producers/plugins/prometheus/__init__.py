"""Prometheus exporters, and the exposition parsing and naming file:// shares (see README.md)."""
