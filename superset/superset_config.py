"""Superset's configuration for jobscope (SUPERSET_CONFIG_PATH points here).

Every value comes from the environment that `python -m stack superset` (stack/superset.py,
where the settings are typed) gives the Superset processes; nothing here is a default secret.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sqlalchemy.engine.url import URL

sys.path.insert(0, str(Path(__file__).parent))  # jobscope_access.py beside this file

SECRET_KEY = os.environ["JOBSCOPE_SUPERSET_SECRET_KEY"]
# Superset's own metadata (users, dashboards): SQLite in the state directory by default, a
# production database (PostgreSQL, MySQL) by URL.
SQLALCHEMY_DATABASE_URI = os.environ["JOBSCOPE_SUPERSET_DATABASE_URL"]

# The ClickHouse connection of the bundle names its user without a password: the password of
# Superset's read-only user is read from the environment when Superset connects, so it is
# never stored in the metadata database or in an exported bundle.
_CLICKHOUSE_USER = os.environ.get("JOBSCOPE_CLICKHOUSE_SUPERSET_USER", "superset")


def _clickhouse_password(url: URL) -> str | None:
    if url.username == _CLICKHOUSE_USER:
        return os.environ.get("JOBSCOPE_CLICKHOUSE_SUPERSET_PASSWORD")
    return url.password


SQLALCHEMY_CUSTOM_PASSWORD_STORE = _clickhouse_password

FEATURE_FLAGS = {
    # The job-scoped datasets are Jinja templates reading the dashboard's job id filter.
    "ENABLE_TEMPLATE_PROCESSING": True,
}

# Grains below a minute on DateTime64(6, 'UTC') columns (the dialect has none).
TIME_GRAIN_ADDON_EXPRESSIONS = {
    "clickhousedb": {
        "PT1S": "toStartOfSecond({col})",
        "PT5S": "toStartOfInterval({col}, INTERVAL 5 SECOND)",
        "PT30S": "toStartOfInterval({col}, INTERVAL 30 SECOND)",
    }
}

# Nothing leaves the machine: browsers may load only from Superset itself. (Superset's
# default policy allows an analytics pixel its pages embed, map tiles and fonts from outside
# hosts; this one blocks them before any request is made.)
TALISMAN_ENABLED = True
TALISMAN_CONFIG = {
    "content_security_policy": {
        "base-uri": ["'self'"],
        "default-src": ["'self'"],
        "img-src": ["'self'", "blob:", "data:"],
        "worker-src": ["'self'", "blob:"],
        "connect-src": ["'self'"],
        "object-src": "'none'",
        "style-src": ["'self'", "'unsafe-inline'"],
        "font-src": ["'self'", "data:"],
        "script-src": ["'self'", "'strict-dynamic'"],
    },
    "content_security_policy_nonce_in": ["script-src"],
    "force_https": False,
    "session_cookie_secure": False,
}

# The site's OpenID Connect provider, when given: users log in through it (the authorization
# code flow of Superset's confidential client), are registered at their first login, and get
# their roles from its access token at each (superset/jobscope_access.py: the API's `jobs`
# read policy as roles and row-level security). Superset's own passwords then serve only its
# REST API (the local admin that imports the dashboards).
_OIDC_ISSUER = os.environ.get("JOBSCOPE_SUPERSET_OIDC_ISSUER", "")
if _OIDC_ISSUER:
    from flask_appbuilder.security.manager import AUTH_OAUTH
    from jobscope_access import JobscopeSecurityManager

    AUTH_TYPE = AUTH_OAUTH
    CUSTOM_SECURITY_MANAGER = JobscopeSecurityManager
    AUTH_USER_REGISTRATION = True
    AUTH_ROLES_SYNC_AT_LOGIN = True
    OAUTH_PROVIDERS = [
        {
            "name": "oidc",
            "icon": "fa-key",
            "token_key": "access_token",
            "remote_app": {
                "client_id": os.environ["JOBSCOPE_SUPERSET_OIDC_CLIENT_ID"],
                "client_secret": os.environ["JOBSCOPE_OIDC_SUPERSET_SECRET"],
                "server_metadata_url": f"{_OIDC_ISSUER}/.well-known/openid-configuration",
                "client_kwargs": {"scope": "openid profile email"},
            },
        }
    ]

# Rows a chart may fetch; SQL Lab shows at most this many.
ROW_LIMIT = 50_000
SQL_MAX_ROW = 100_000
SUPERSET_WEBSERVER_TIMEOUT = 120
