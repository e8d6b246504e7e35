"""SQL of the API, one module per concern; every value is a bound parameter."""

# Kwollect's timestamp, ISO 8601 with microseconds and the UTC offset, as ClickHouse makes it.
ISO_FORMAT = "'%Y-%m-%dT%H:%i:%S.%f+00:00'"


def iso_sql(column: str) -> str:
    """SQL formatting `column` (a UTC DateTime64) as Kwollect's timestamp."""
    return f"formatDateTime({column}, {ISO_FORMAT})"
