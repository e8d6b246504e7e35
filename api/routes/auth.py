"""GET /api/auth/oidc: the site's OpenID Connect provider, so that `jobscope login` needs
nothing but the API's address (jobscope/login.py). Open under every read policy."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.infra.config import ApiSettings
from api.infra.errors import NotFound
from api.schemas import ErrorBody, OidcProvider

router = APIRouter(prefix="/api/auth", tags=["auth"])

ONLY_OWN_TOKENS = "this jobscope accepts only its own tokens (ask its admin for one)"


@router.get(
    "/oidc",
    operation_id="get_oidc_provider",
    response_model=OidcProvider,
    responses={404: {"model": ErrorBody, "description": "no provider: JOBSCOPE_OIDC_ISSUER unset"}},
    summary="The identity provider whose access tokens this API accepts",
)
def get_oidc_provider(request: Request) -> OidcProvider:
    settings: ApiSettings = request.app.state.settings
    if not settings.oidc_issuer:
        raise NotFound(ONLY_OWN_TOKENS)
    return OidcProvider(
        issuer=settings.oidc_issuer,
        client_id=settings.oidc_cli_client_id,
        audience=settings.oidc_audience,
    )
