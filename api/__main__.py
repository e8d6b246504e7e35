"""`python -m api`: serve the API on JOBSCOPE_API_HOST:JOBSCOPE_API_PORT (api/server.py)."""

from __future__ import annotations

from api.config import ApiSettings
from api.server import serve


def main() -> None:
    serve(ApiSettings())  # type: ignore[call-arg]


if __name__ == "__main__":
    main()
