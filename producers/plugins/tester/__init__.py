"""Simulated devices with deterministic values (see README.md)."""
