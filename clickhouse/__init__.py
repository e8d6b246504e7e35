"""ClickHouse side of jobscope: schema migrations and the local server of the embedded default."""
