"""What an `snmp://` entry says: its URL (Kwollect's form) and its `options` (jobscope's).

Everything is validated here, without I/O, when the devices file loads: a bad OID, an
unknown protocol or an unset password variable is reported with its entry.
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from producers.entry import DeviceEntry
from producers.plugins.base import validated

DEFAULT_PORT = 161
DEFAULT_COMMUNITY = "public"
_OID = re.compile(r"^\d+(\.\d+)+$")
_KWOLLECT_TEMPLATE = re.compile(r"\{\{(.*?)==(.*?)\}\}")
"""Kwollect's `{{ <OID prefix> == <value> }}`: the index whose value under the prefix matches."""
_INDEX_VARIABLE = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")
"""jobscope's `{{ outlet }}`: one OID per value of `options.indexes.outlet`."""

AUTH_PROTOCOLS = ("MD5", "SHA", "SHA-224", "SHA-256", "SHA-384", "SHA-512")
PRIV_PROTOCOLS = ("DES", "AES", "AES-192", "AES-256")


class V3Options(BaseModel):
    """SNMPv3 (USM): the user is the URL's user part unless `user` is given; passwords come
    from environment variables, never from the devices file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str | None = None
    level: Literal["noAuthNoPriv", "authNoPriv", "authPriv"] = "authPriv"
    auth_protocol: Literal[AUTH_PROTOCOLS] = "SHA"  # type: ignore[valid-type]
    auth_password_env: str | None = None
    priv_protocol: Literal[PRIV_PROTOCOLS] = "AES"  # type: ignore[valid-type]
    priv_password_env: str | None = None

    @model_validator(mode="after")
    def _passwords_for_level(self) -> V3Options:
        if self.level != "noAuthNoPriv" and not self.auth_password_env:
            raise ValueError(f"level {self.level} needs auth_password_env")
        if self.level == "authPriv" and not self.priv_password_env:
            raise ValueError("level authPriv needs priv_password_env")
        return self


class SnmpOptions(BaseModel):
    """The `options` of an `snmp://` entry (all optional: Kwollect's entries have none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v3: V3Options | None = Field(None, description="use SNMPv3 with this user")
    indexes: dict[str, str | list[int | str]] = Field(
        default_factory=dict,
        description="values of each {{ variable }} of the OID: a list, or ranges '1-24,30'",
    )
    walk: bool = Field(False, description="the OID is a table column: one reading per row")
    index_label: str = Field("index", description="label holding a walked row's index")
    label_oids: dict[str, str] = Field(
        default_factory=dict,
        description="label -> OID read beside the value (for a walk: a column, the row's "
        "index appended); refreshed every refresh_s",
    )
    aliases: dict[str, str] = Field(
        default_factory=dict,
        description="value of the alias_by label -> the device the reading is also for "
        "(`_device_alias`)",
    )
    alias_by: str | None = Field(
        None, description="label whose value keys `aliases` (default: the index label)"
    )
    divisor: float | None = Field(None, gt=0, description="every value is divided by it")
    decimals_oid: str | None = Field(
        None,
        description="OID of the value's decimal digits (templated or a column like "
        "label_oids): the value is divided by 10^digits (Raritan PDUs)",
    )
    timeout_s: float = Field(1.0, gt=0, le=60, description="per request")
    retries: int = Field(1, ge=0, le=5, description="a request is resent this many times")
    max_oids: int = Field(40, ge=1, le=200, description="OIDs per GET request")
    max_repetitions: int = Field(25, ge=1, le=200, description="rows per GETBULK answer")
    refresh_s: float = Field(
        300, gt=0, description="how often templates, labels and decimals are read again"
    )

    @field_validator("indexes")
    @classmethod
    def _ranges(cls, indexes: dict[str, str | list[int | str]]) -> dict[str, str | list[int | str]]:
        for name, spec in indexes.items():
            try:
                if not _values(spec):
                    raise ValueError
            except ValueError:
                raise ValueError(f"{name}: expected a list or ranges such as '1-24,30'") from None
        return indexes

    @model_validator(mode="after")
    def _coherent(self) -> SnmpOptions:
        if self.walk and self.indexes:
            raise ValueError("walk and indexes exclude each other")
        return self


class Agent(BaseModel):
    """Who to ask and how: entries with equal agents (and periods) share requests."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int
    community: str
    v3: V3Options | None
    timeout_s: float
    retries: int
    max_oids: int
    max_repetitions: int

    def __str__(self) -> str:
        who = f"user {self.v3.user}" if self.v3 else "a community"  # a password: never shown
        return f"{self.host}:{self.port} ({'v3' if self.v3 else 'v2c'}, {who})"


class EntrySpec(BaseModel):
    """One `snmp://` entry, parsed."""

    model_config = ConfigDict(frozen=True)

    agent: Agent
    oid: str
    """The OID, possibly with one Kwollect template or jobscope {{ variables }}."""
    options: SnmpOptions


def parse(entry: DeviceEntry) -> EntrySpec:
    """Parse and check an `snmp://` entry; ValueError naming what is wrong."""
    parts = urlsplit(entry.url)
    if parts.query or parts.fragment:
        raise ValueError("snmp:// takes no ?query: jobscope's settings go in `options`")
    if not parts.hostname:
        raise ValueError("snmp:// needs a host: snmp://[community@]host[:port]/OID")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"bad port: {exc}") from None
    if parts.password is not None:
        raise ValueError("snmp:// takes a community (or v3 user) before '@', not user:password")
    options = validated(entry.options, SnmpOptions)
    userinfo = unquote(parts.username) if parts.username else None
    v3 = options.v3
    if v3 is not None:
        if not (v3.user or userinfo):
            raise ValueError("SNMPv3 needs a user: snmp://user@host/OID or options.v3.user")
        v3 = v3.model_copy(update={"user": v3.user or userinfo})
        for env in (v3.auth_password_env, v3.priv_password_env):
            if env and not os.environ.get(env):
                raise ValueError(f"environment variable {env} (a v3 password) is not set")
    oid = unquote(parts.path).lstrip("/")
    _check_oid(oid, options)
    for label, label_oid in options.label_oids.items():
        _check_oid(label_oid, options, f"label_oids.{label}", template_ok=False)
    if options.decimals_oid:
        _check_oid(options.decimals_oid, options, "decimals_oid", template_ok=False)
    if options.aliases and not options.walk and not options.indexes:
        raise ValueError("aliases need rows: a walk or {{ variable }} indexes")
    agent = Agent(
        host=parts.hostname,
        port=port,
        community=userinfo or DEFAULT_COMMUNITY,
        v3=v3,
        timeout_s=options.timeout_s,
        retries=options.retries,
        max_oids=options.max_oids,
        max_repetitions=options.max_repetitions,
    )
    return EntrySpec(agent=agent, oid=oid, options=options)


def _check_oid(oid: str, options: SnmpOptions, what: str = "OID", template_ok: bool = True) -> None:
    """A numeric OID, with {{ variables }} that `indexes` defines, or (for the URL) one
    Kwollect template."""
    plain = _KWOLLECT_TEMPLATE.sub("1", oid) if template_ok else oid
    if template_ok and len(_KWOLLECT_TEMPLATE.findall(oid)) > 1:
        raise ValueError(f"{what} {oid!r}: at most one {{{{ prefix == value }}}} template")
    if _KWOLLECT_TEMPLATE.search(oid) and _INDEX_VARIABLE.search(oid):
        raise ValueError(f"{what} {oid!r}: either {{{{ prefix == value }}}} or {{{{ variable }}}}")
    for name in _INDEX_VARIABLE.findall(plain):
        if name not in options.indexes:
            raise ValueError(f"{what} {oid!r}: {{{{ {name} }}}} has no values in options.indexes")
    plain = _INDEX_VARIABLE.sub("1", plain)
    if not _OID.match(plain):
        raise ValueError(f"{what} {oid!r} is not a numeric OID such as 1.3.6.1.2.1.1.3.0")
    for prefix, _ in _KWOLLECT_TEMPLATE.findall(oid):
        if not _OID.match(prefix.strip()):
            raise ValueError(f"{what} {oid!r}: template prefix {prefix.strip()!r} is not an OID")


def kwollect_template(oid: str) -> tuple[str, str] | None:
    """(prefix, value) of a Kwollect template in `oid`, if any."""
    match = _KWOLLECT_TEMPLATE.search(oid)
    return (match.group(1).strip(), match.group(2).strip()) if match else None


def with_index(oid: str, index: str) -> str:
    """`oid` with its Kwollect template replaced by a resolved index."""
    return _KWOLLECT_TEMPLATE.sub(index, oid)


def expansions(oid: str, indexes: dict[str, str | list[int | str]]) -> list[dict[str, str]]:
    """Every assignment of the {{ variables }} of `oid` (one empty one when it has none)."""
    names = list(dict.fromkeys(_INDEX_VARIABLE.findall(oid)))
    values = [_values(indexes[name]) for name in names]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def substitute(oid: str, assignment: dict[str, str]) -> str:
    return _INDEX_VARIABLE.sub(lambda m: assignment[m.group(1)], oid)


def _values(spec: str | list[int | str]) -> list[str]:
    """`[1, 2]` or `'1-24,30'` -> ['1', '2', ...]."""
    if isinstance(spec, list):
        return [str(value) for value in spec]
    values: list[str] = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        if high:
            values.extend(str(i) for i in range(int(low), int(high) + 1))
        elif low:
            values.append(low)
    return values
