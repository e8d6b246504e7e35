"""Requests to one SNMP agent: GETs packed up to `max_oids` OIDs, GETBULK walks, timeouts,
retries, a process-wide cap on requests in flight, and backoff for an agent that stopped
answering, so that a dead PDU costs almost nothing and never delays a live one.

Built on gufo_snmp (BER coding and sockets in Rust; chosen by measurement, see
producers/README.md). It returns bare Python values (int, bytes, str...) without their SNMP
types and leaves out of a GET's answer the OIDs the agent has no value for (noSuchObject,
noSuchInstance): the caller counts those.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from gufo.snmp import SnmpAuthError, SnmpError, User
from gufo.snmp import user as keys
from gufo.snmp.aio.client import SnmpSession
from gufo.snmp.typing import ValueType

from producers.plugins.base import ProcessLimit
from producers.plugins.snmp.options import Agent, V3Options

MAX_IN_FLIGHT = 64
"""Requests in flight per process: bursts beyond overflow UDP receive buffers."""
MAX_BACKOFF_S = 60.0
_V3_REFRESH_S = 100.0
"""gufo's advice: refresh SNMPv3 engine time when 150 s passed since the last request."""
_AUTH = {
    "MD5": keys.Md5Key,
    "SHA": keys.Sha1Key,
    "SHA-224": keys.Sha224Key,
    "SHA-256": keys.Sha256Key,
    "SHA-384": keys.Sha384Key,
    "SHA-512": keys.Sha512Key,
}
_PRIV = {
    "DES": keys.DesKey,
    "AES": keys.Aes128Key,
    "AES-192": keys.Aes192Key,
    "AES-256": keys.Aes256Key,
}
_in_flight = ProcessLimit(MAX_IN_FLIGHT)


class AgentUnavailable(Exception):
    """The agent did not answer, refused our credentials, or is in backoff."""


def v3_user(v3: V3Options) -> User:
    """The USM user of `v3`, its passwords read from the environment (checked at load)."""
    auth = _AUTH[v3.auth_protocol](os.environ.get(v3.auth_password_env or "", "").encode())
    priv = _PRIV[v3.priv_protocol](os.environ.get(v3.priv_password_env or "", "").encode())
    return User(
        v3.user or "",
        auth_key=auth if v3.level != "noAuthNoPriv" else None,
        priv_key=priv if v3.level == "authPriv" else None,
    )


class AgentClient:
    """Sequential requests to one agent through one session (one UDP socket), rebuilt after
    a failure so that a late answer to an abandoned request is never taken for another's."""

    def __init__(self, agent: Agent, period_s: float) -> None:
        self.agent = agent
        self.period_s = period_s
        self._session: SnmpSession | None = None
        self._refreshed = 0.0
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""

    async def get(self, oids: list[str]) -> dict[str, ValueType]:
        """Values of `oids` (those the agent has), in requests of at most `max_oids`."""
        values: dict[str, ValueType] = {}
        step = self.agent.max_oids
        for start in range(0, len(oids), step):
            chunk = oids[start : start + step]
            values.update(await self._request(lambda s, c=chunk: s.get_many(c)))
        return values

    async def walk(self, prefix: str) -> dict[str, ValueType]:
        """index -> value of every OID under `prefix` (GETBULK, `max_repetitions` per answer)."""

        async def run(session: SnmpSession) -> dict[str, ValueType]:
            start = len(prefix) + 1
            return {
                oid[start:]: value
                async for oid, value in session.getbulk(prefix, self.agent.max_repetitions)
            }

        return await self._request(run)

    async def _request(self, send: Callable[[SnmpSession], Any]) -> Any:
        now = time.monotonic()
        if now < self._retry_at:
            raise AgentUnavailable(
                f"{self._last_error}; next try in {self._retry_at - now:.0f} s (backoff)"
            )
        try:
            async with _in_flight():
                result = await self._attempts(send)
        except asyncio.CancelledError:
            self._failed("no answer before the poll's deadline")
            raise
        except AgentUnavailable as exc:
            self._failed(str(exc))
            raise
        self._failures = 0
        return result

    async def _attempts(self, send: Callable[[SnmpSession], Any]) -> Any:
        agent = self.agent
        for _ in range(agent.retries + 1):
            try:
                return await send(await self._open())
            except TimeoutError:
                self._session = None
            except SnmpAuthError as exc:
                self._session = None
                reason = str(exc) or "wrong password or protocol?"
                raise AgentUnavailable(
                    f"SNMPv3 authentication refused by {agent} ({reason})"
                ) from None
            except (SnmpError, OSError) as exc:
                self._session = None
                raise AgentUnavailable(f"{agent}: {type(exc).__name__}: {exc}") from None
        community_hint = "" if agent.v3 else ", or wrong community"
        raise AgentUnavailable(
            f"no answer from {agent} within {agent.timeout_s:g} s x {agent.retries + 1} "
            f"tries (agent down{community_hint}?)"
        )

    async def _open(self) -> SnmpSession:
        agent = self.agent
        if self._session is None:
            loop = asyncio.get_running_loop()
            found = await loop.getaddrinfo(agent.host, agent.port, type=socket.SOCK_DGRAM)
            self._session = SnmpSession(
                addr=str(found[0][4][0]),
                port=agent.port,
                community=agent.community,
                user=v3_user(agent.v3) if agent.v3 else None,
                timeout=agent.timeout_s,
                max_repetitions=agent.max_repetitions,
                recv_buffer=1 << 20,
            )
            self._refreshed = 0.0
        if agent.v3 and time.monotonic() - self._refreshed > _V3_REFRESH_S:
            await self._session.refresh()
            self._refreshed = time.monotonic()
        return self._session

    def close(self) -> None:
        """Drop the session (gufo closes its socket when the session is collected)."""
        self._session = None

    def _failed(self, error: str) -> None:
        """Back off: after the n-th failure in a row, skip 2^(n-1) - 1 periods (at most
        MAX_BACKOFF_S); one lost answer only costs its own tick."""
        self._session = None
        self._failures += 1
        self._last_error = error
        pause = min(self.period_s * (2 ** min(self._failures - 1, 16) - 1), MAX_BACKOFF_S)
        self._retry_at = time.monotonic() + pause
