"""`python -m api`: serve the API on JOBSCOPE_API_HOST:JOBSCOPE_API_PORT (api/infra/server.py).
Invalid settings (e.g. a token too short) stop it at once, each named on stderr."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from api.infra.config import ApiSettings
from api.infra.server import serve
from api.main import create_app


def main() -> None:
    try:
        settings = ApiSettings()  # type: ignore[call-arg]
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            print(f"jobscope API: invalid setting {where}: {error['msg']}", file=sys.stderr)
        sys.exit(2)
    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
