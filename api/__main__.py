"""`python -m api`: serve the API with uvicorn on JOBSCOPE_API_HOST:JOBSCOPE_API_PORT."""

from __future__ import annotations

import uvicorn

from api.config import ApiSettings
from api.main import create_app


def main() -> None:
    settings = ApiSettings()  # type: ignore[call-arg]
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="info",
        access_log=False,
        # live streams never end on their own: past this, shutdown closes them
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
    )


if __name__ == "__main__":
    main()
