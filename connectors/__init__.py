"""Kafka Connect: a distributed worker and the connectors it runs (see connectors/README.md)."""
