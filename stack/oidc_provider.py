"""A local OpenID Connect provider: Keycloak, for `make up AUTH=oidc` and the tests.

A site brings its own provider (Keycloak, Authentik, an institutional SSO): the API needs
only its issuer (JOBSCOPE_OIDC_ISSUER, docs/access.md). This one stands in for it on one
machine: Keycloak's distribution, resolved by Maven into its local repository (cached like
Kafka's jars), unpacked and built once into the user's cache directory, and started per
state directory from a hard-linked copy (its `data/` is its own), with an in-memory
database: the demo realm (`realm_document`) is created through the admin API at each start.
The realm `jobscope` has the users alice (project p1), bob (p2), pia (p1's manager, role
`project`) and sam (role `support`), one demo password (JOBSCOPE_OIDC_DEMO_PASSWORD in
secrets.env), and the clients `jobscope-cli` (the device authorization grant of
`jobscope login`), `jobscope-service` (client credentials: a scheduler's hooks) and
`jobscope-superset` (Superset's login); every access token is for the audience `jobscope`
and lists its user's groups.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import httpx
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from stack import secrets
from stack.config import StackSettings, cache_home
from stack.processes import ManagedProcess
from stack.transient import STARTING

ADMIN_USER = "admin"
DEMO_USERS = {
    "alice": {"groups": ["p1"], "roles": []},
    "bob": {"groups": ["p2"], "roles": []},
    "pia": {"groups": ["p1"], "roles": ["project"]},
    "sam": {"groups": [], "roles": ["support"]},
}
REALM_ROLES = ("admin", "support", "project", "scheduler", "pusher")
CLI_CLIENT = "jobscope-cli"
SERVICE_CLIENT = "jobscope-service"
SUPERSET_CLIENT = "jobscope-superset"


class OidcProviderSettings(BaseSettings):
    """Every value can be set by an environment variable `JOBSCOPE_OIDC_PROVIDER_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="JOBSCOPE_OIDC_PROVIDER_", extra="ignore")

    version: str = Field("26.5.6", description="Keycloak's version (its Quarkus distribution)")
    host: str = Field("127.0.0.1", description="the provider binds to this address")
    port: int = Field(8180, description="its HTTP port (issuer http://host:port/realms/...)")
    realm: str = Field("jobscope", description="the realm whose issuer the API trusts")
    audience: str = Field("jobscope", description="the audience of its access tokens")
    heap: str = Field("512m", description="JVM heap of the provider")
    cache_dir: Path = Field(
        default_factory=cache_home,
        description="its distribution, unpacked and built once (default: the user's cache)",
    )
    superset_url: str = Field(
        "http://127.0.0.1:8088", description="Superset's address: where its login returns"
    )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def issuer(self) -> str:
        return f"{self.url}/realms/{self.realm}"

    @property
    def distribution(self) -> Path:
        return self.cache_dir / f"keycloak-{self.version}"


def install(settings: OidcProviderSettings) -> Path:
    """The built distribution (Maven resolves it, once; then it is unpacked and built once
    under a lock, so that parallel test workers share one)."""
    built = settings.distribution / ".built"
    if built.exists():
        return settings.distribution
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.cache_dir / "keycloak.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            _unpack_and_build(settings)
    return settings.distribution


def _unpack_and_build(settings: OidcProviderSettings) -> None:
    shutil.rmtree(settings.distribution, ignore_errors=True)
    artifact = f"org.keycloak:keycloak-quarkus-dist:{settings.version}:tar.gz"
    with tempfile.TemporaryDirectory(dir=settings.cache_dir) as tmp:
        subprocess.run(
            ["mvn", "-q", "dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={tmp}"],
            check=True,
        )
        (archive,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(settings.cache_dir, filter="data")
    # The in-memory database and the options a start needs are built in once (`--optimized`).
    subprocess.run(
        [str(settings.distribution / "bin" / "kc.sh"), "build", "--db=dev-mem"],
        check=True,
        env={**secrets.public_environ(), **_java_env(settings)},
        stdout=subprocess.DEVNULL,
    )
    (settings.distribution / ".built").touch()


def _java_env(settings: OidcProviderSettings) -> dict[str, str]:
    """Its JVM's options. Keycloak picks its own collector: the tests' JDK_JAVA_OPTIONS
    (another one) would stop its JVM."""
    return {
        "JDK_JAVA_OPTIONS": "",
        "JAVA_OPTS_KC_HEAP": f"-Xms64m -Xmx{settings.heap}",
        "JAVA_OPTS_APPEND": "-XX:TieredStopAtLevel=1",  # it lives minutes in tests: C1 only
    }


def process(stack: StackSettings) -> ManagedProcess:
    return ManagedProcess("oidc-provider", stack.pid_dir, stack.log_dir)


def start(stack: StackSettings, settings: OidcProviderSettings, timeout: float = 180.0) -> None:
    """Start the provider of this state directory and create its demo realm."""
    distribution = install(settings)
    home = stack.state_dir / "oidc-provider"
    shutil.rmtree(home, ignore_errors=True)  # an in-memory database: nothing to keep
    home.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(distribution), str(home)], check=True)
    values = secrets.load_or_create(stack.state_dir)
    env = {
        **_java_env(settings),
        "KC_BOOTSTRAP_ADMIN_USERNAME": ADMIN_USER,
        "KC_BOOTSTRAP_ADMIN_PASSWORD": values["JOBSCOPE_OIDC_ADMIN_PASSWORD"],
    }
    command = [
        str(home / "bin" / "kc.sh"),
        "start",
        "--optimized",
        "--http-enabled=true",
        "--hostname-strict=false",
        f"--http-host={settings.host}",
        f"--http-port={settings.port}",
    ]
    proc = process(stack)
    proc.start(command, env=env, cwd=home, ports=[(settings.host, settings.port)])
    discovery = f"{settings.url}/realms/master/.well-known/openid-configuration"
    proc.wait_ready(
        lambda: httpx.get(discovery, timeout=2).status_code == 200,
        timeout,
        f"Keycloak on {settings.url}",
        interval=0.5,
        transient=STARTING,
    )
    admin = AdminApi(settings, values["JOBSCOPE_OIDC_ADMIN_PASSWORD"])
    admin.create_realm(realm_document(settings, values))


def realm_document(settings: OidcProviderSettings, values: dict[str, str]) -> dict[str, Any]:
    """The demo realm: its roles, projects (groups), users and clients."""
    mappers = [
        {
            "name": "audience",
            "protocol": "openid-connect",
            "protocolMapper": "oidc-audience-mapper",
            "config": {
                "included.custom.audience": settings.audience,
                "access.token.claim": "true",
                "id.token.claim": "false",
            },
        },
        {
            "name": "groups",
            "protocol": "openid-connect",
            "protocolMapper": "oidc-group-membership-mapper",
            "config": {
                "claim.name": "groups",
                "full.path": "false",
                "access.token.claim": "true",
                "id.token.claim": "true",
                "userinfo.token.claim": "true",
            },
        },
    ]
    users = [
        {
            "username": name,
            "enabled": True,
            "email": f"{name}@example.org",
            "emailVerified": True,
            "firstName": name.capitalize(),
            "lastName": "Demo",
            "credentials": [
                {"type": "password", "value": values["JOBSCOPE_OIDC_DEMO_PASSWORD"]},
            ],
            "groups": [f"/{g}" for g in user["groups"]],
            "realmRoles": user["roles"],
        }
        for name, user in DEMO_USERS.items()
    ]
    users.append(
        {
            "username": f"service-account-{SERVICE_CLIENT}",
            "enabled": True,
            "serviceAccountClientId": SERVICE_CLIENT,
            "realmRoles": ["scheduler"],
        }
    )
    return {
        "realm": settings.realm,
        "enabled": True,
        "roles": {"realm": [{"name": role} for role in REALM_ROLES]},
        "groups": [{"name": "p1"}, {"name": "p2"}],
        "users": users,
        "clients": [
            {
                "clientId": CLI_CLIENT,
                "publicClient": True,
                "standardFlowEnabled": False,
                "directAccessGrantsEnabled": True,
                "attributes": {"oauth2.device.authorization.grant.enabled": "true"},
                "protocolMappers": mappers,
            },
            {
                "clientId": SERVICE_CLIENT,
                "publicClient": False,
                "secret": values["JOBSCOPE_OIDC_SERVICE_SECRET"],
                "serviceAccountsEnabled": True,
                "standardFlowEnabled": False,
                "protocolMappers": mappers,
            },
            {
                "clientId": SUPERSET_CLIENT,
                "publicClient": False,
                "secret": values["JOBSCOPE_OIDC_SUPERSET_SECRET"],
                "standardFlowEnabled": True,
                "redirectUris": [f"{settings.superset_url.rstrip('/')}/*"],
                "protocolMappers": mappers,
            },
        ],
    }


class AdminApi:
    """Keycloak's admin REST API, as its bootstrap admin: what the stack and the tests need
    (a realm, its signing keys)."""

    def __init__(self, settings: OidcProviderSettings, password: str) -> None:
        self.settings = settings
        self.password = password

    def _headers(self) -> dict[str, str]:
        response = httpx.post(
            f"{self.settings.url}/realms/master/protocol/openid-connect/token",
            data={
                "grant_type": "password",
                "client_id": "admin-cli",
                "username": ADMIN_USER,
                "password": self.password,
            },
            timeout=30,
        )
        response.raise_for_status()
        return {"Authorization": f"Bearer {response.json()['access_token']}"}

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """`path` under /admin/realms; a failure raises with Keycloak's answer."""
        url = f"{self.settings.url}/admin/realms{path}"
        response = httpx.request(method, url, headers=self._headers(), timeout=30, **kwargs)
        if response.is_error:
            raise RuntimeError(f"Keycloak: {method} {path}: {response.status_code} {response.text}")
        return response

    def create_realm(self, document: dict[str, Any]) -> None:
        exists = httpx.get(f"{self.settings.url}/realms/{document['realm']}", timeout=10)
        if exists.status_code == 404:
            self.request("POST", "", json=document)

    def signing_keys(self, realm: str) -> list[dict[str, Any]]:
        """The realm's active RS256 keys (kid, providerId, priority), highest priority first."""
        keys = self.request("GET", f"/{realm}/keys").json()["keys"]
        active = [k for k in keys if k["algorithm"] == "RS256" and k["status"] == "ACTIVE"]
        return sorted(active, key=lambda k: -int(k["providerPriority"]))

    def rotate_key(self, realm: str, name: str, priority: int) -> None:
        """A new RS256 key that signs from now on (a higher `priority` than the current)."""
        realm_id = self.request("GET", f"/{realm}").json()["id"]
        self.request(
            "POST",
            f"/{realm}/components",
            json={
                "name": name,
                "providerId": "rsa-generated",
                "providerType": "org.keycloak.keys.KeyProvider",
                "parentId": realm_id,
                "config": {"priority": [str(priority)], "algorithm": ["RS256"]},
            },
        )

    def retire_key(self, realm: str, provider_id: str) -> None:
        """Delete a key provider: its key no longer signs, nor appears in the JWKS."""
        self.request("DELETE", f"/{realm}/components/{provider_id}")


if __name__ == "__main__":  # `make oidc-provider` (before `make test`)
    install(OidcProviderSettings())
