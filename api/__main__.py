"""`python -m api`: serve the API on JOBSCOPE_API_HOST:JOBSCOPE_API_PORT (api/infra/server.py).
Invalid settings (e.g. a token too short) or an invalid metric registry stop it at once,
each named on stderr."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from api.infra.config import ApiSettings
from api.infra.server import serve
from api.main import create_app
from api.notes import NoteRulesError
from api.registry import RegistryError


def main() -> None:
    try:
        settings = ApiSettings()  # type: ignore[call-arg]
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            print(f"jobscope API: invalid setting {where}: {error['msg']}", file=sys.stderr)
        sys.exit(2)
    try:
        app = create_app(settings)
    except RegistryError as exc:
        print(f"jobscope API: invalid metric registry:\n{exc}", file=sys.stderr)
        sys.exit(2)
    except NoteRulesError as exc:
        print(f"jobscope API: invalid note rules:\n{exc}", file=sys.stderr)
        sys.exit(2)
    serve(app, settings)


if __name__ == "__main__":
    main()
