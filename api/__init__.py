"""The jobscope REST API (FastAPI): job-scoped metrics out of ClickHouse."""
