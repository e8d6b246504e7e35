"""Who sees what in Superset: the `jobs` read policy of the API, as Superset roles and
row-level security (imported by superset_config.py and import_assets.py, in Superset's venv).

Roles (created or brought up to date at every start, by `ensure_roles_and_rls`):
- `Admin` (Superset's own): a provider's `admin`.
- `jobscope_all_jobs`: `support` and `scheduler`: every dashboard, every row.
- `jobscope_user`: everyone else: the job-scoped datasets and the job filter's node and metric
  lists, restricted by the row-level security below; no device readings outside jobs.
- `jobscope_project_<name>`: one per project a user may read (no permissions of its own: the
  row-level security reads the project from its name). A `project` manager gets one per group;
  with JOBSCOPE_MEMBERS_READ_PROJECT=true every member does.

Row-level security: base filters (they hold for every role but those they exclude: Admin and
`jobscope_all_jobs`), so that a user given any other role sees nothing it was not granted.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jwt
from superset.security import SupersetSecurityManager

ALL_JOBS_ROLE = "jobscope_all_jobs"
USER_ROLE = "jobscope_user"
PROJECT_ROLE_PREFIX = "jobscope_project_"
UNRESTRICTED = ("Admin", ALL_JOBS_ROLE)
JOB_DATASETS = ("job_readings", "job_energy", "job_rates")
"""Virtual datasets of one job's scope: each row names its job (`job_id`)."""
OUTSIDE_JOBS_DATASETS = ("metrics_latest",)
"""Readings outside any job that users may be granted (the node and metric lists of the Job
dashboard's filters) but see no row of. The other device datasets (metrics, rollups, freshness,
ingest errors) are not granted to users at all: the job datasets read the raw tables, and a
row filter on those would empty them."""

# Quoted for a ClickHouse string literal (Jinja, in Superset's sandbox).
_QUOTED = r"""'{{ %s | replace("\\", "\\\\") | replace("'", "\\'") }}'"""
VISIBLE_JOBS = (
    f"`user` = {_QUOTED % 'current_username()'}"
    "{%- for role in current_user_roles() or [] "
    f"if role.startswith('{PROJECT_ROLE_PREFIX}') %}}"
    f" OR project = {_QUOTED % f'role[{len(PROJECT_ROLE_PREFIX)}:]'}"
    "{%- endfor %}"
)
"""A job the current user may read: their own, or one of a project they have the role of."""
RLS_FILTERS: dict[str, tuple[tuple[str, ...], str]] = {
    "jobscope: own and project jobs": (("jobs",), VISIBLE_JOBS),
    "jobscope: readings of visible jobs": (
        JOB_DATASETS,
        f"job_id IN (SELECT job_id FROM jobs WHERE {VISIBLE_JOBS})",
    ),
    "jobscope: no readings outside jobs": (OUTSIDE_JOBS_DATASETS, "1 = 0"),
}
"""Name: (datasets, clause)."""

_STRONGEST_FIRST = ("admin", "support", "scheduler", "project", "pusher", "agent", "user")
"""As the API's (api/infra/oidc.py): a user with several roles acts with the first it has."""


def _claim(claims: dict[str, Any], path: str) -> list[str]:
    """A list of strings at a dotted path of the claims (`realm_access.roles`); [] if none."""
    value: Any = claims
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def superset_roles(claims: dict[str, Any]) -> list[str]:
    """The Superset roles of a user with these access token claims, mapped as the API maps
    them (the same JOBSCOPE_OIDC_* settings: docs/configuration.md)."""
    env = os.environ
    role_map = json.loads(env.get("JOBSCOPE_OIDC_ROLE_MAP") or "{}")
    theirs = _claim(claims, env.get("JOBSCOPE_OIDC_ROLES_CLAIM", "realm_access.roles"))
    named = {role_map.get(r, r) for r in theirs}
    role = next((r for r in _STRONGEST_FIRST if r in named), "user")
    if role == "admin":
        return ["Admin"]
    if role in ("support", "scheduler"):
        return [ALL_JOBS_ROLE]
    if role == "agent":
        return []
    groups = _claim(claims, env.get("JOBSCOPE_OIDC_PROJECTS_CLAIM", "groups"))
    members_read = env.get("JOBSCOPE_MEMBERS_READ_PROJECT", "").lower() in ("1", "true", "yes")
    projects = sorted(
        {g.removeprefix("/") for g in groups} if role == "project" or members_read else ()
    )
    return [USER_ROLE, *(PROJECT_ROLE_PREFIX + p for p in projects if p)]


class JobscopeSecurityManager(SupersetSecurityManager):
    """Superset's security manager, mapping the provider's access token to a user and roles."""

    def get_oauth_user_info(self, provider: str, resp: dict[str, Any]) -> dict[str, Any]:
        """The user from the access token Superset was just given by the provider's token
        endpoint, its signature, issuer and audience checked with the provider's keys."""
        claims = self._verified(provider, resp["access_token"])
        username = claims.get(os.environ.get("JOBSCOPE_OIDC_USER_CLAIM", "preferred_username"))
        return {
            "username": username if isinstance(username, str) else "",
            "first_name": claims.get("given_name", ""),
            "last_name": claims.get("family_name", ""),
            "email": claims.get("email", ""),
            "role_keys": superset_roles(claims),
        }

    def _verified(self, provider: str, token: str) -> dict[str, Any]:
        remote = self.oauth_remotes[provider]
        metadata = remote.load_server_metadata()
        kid = jwt.get_unverified_header(token).get("kid")
        keys = jwt.PyJWKSet.from_dict(remote.fetch_jwk_set())
        if kid not in {k.key_id for k in keys.keys}:  # rotated: read the keys again
            keys = jwt.PyJWKSet.from_dict(remote.fetch_jwk_set(force=True))
        key = next(k for k in keys.keys if k.key_id == kid)
        return jwt.decode(
            token,
            key,
            algorithms=["RS256", "RS384", "RS512", "PS256", "ES256", "ES384"],
            audience=os.environ["JOBSCOPE_SUPERSET_OIDC_AUDIENCE"],
            issuer=metadata["issuer"],
            leeway=30,
        )

    def _oauth_calculate_user_roles(self, userinfo: dict[str, Any]) -> list[Any]:
        """The roles named by get_oauth_user_info, a project's created at its first use."""
        return [self.find_role(name) or self.add_role(name) for name in userinfo["role_keys"]]


def ensure_roles_and_rls() -> None:
    """Create or update the roles and row-level security filters (idempotent)."""
    from superset.connectors.sqla.models import RowLevelSecurityFilter, SqlaTable
    from superset.utils.core import RowLevelSecurityFilterType

    from superset import db, security_manager

    sm = security_manager
    datasets = {t.table_name: t for t in db.session.query(SqlaTable).all()}
    gamma = list(sm.find_role("Gamma").permissions)
    granted = [
        sm.add_permission_view_menu("datasource_access", datasets[name].perm)
        for name in ("jobs", *JOB_DATASETS, *OUTSIDE_JOBS_DATASETS)
    ]
    every = sm.add_permission_view_menu("all_datasource_access", "all_datasource_access")
    for name, extra in ((USER_ROLE, granted), (ALL_JOBS_ROLE, [every])):
        role = sm.find_role(name) or sm.add_role(name)
        role.permissions = gamma + extra
    excluded = [sm.find_role(name) for name in UNRESTRICTED]
    for name, (tables, clause) in RLS_FILTERS.items():
        rls = db.session.query(RowLevelSecurityFilter).filter_by(name=name).one_or_none()
        if rls is None:
            rls = RowLevelSecurityFilter(name=name)
            db.session.add(rls)
        rls.filter_type = RowLevelSecurityFilterType.BASE
        rls.group_key = None
        rls.clause = clause
        rls.description = "jobscope's `jobs` read policy (superset/jobscope_access.py)"
        rls.tables = [datasets[t] for t in tables]
        rls.roles = excluded
    db.session.commit()
