"""The API's own /metrics (api/infra/monitoring.py) against the session's API: what an
anonymous client sends cannot grow its series."""

from __future__ import annotations

import socket
import uuid
from urllib.parse import urlsplit

import httpx


def _raw(api_url: str, request: bytes) -> bytes:
    address = urlsplit(api_url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(4096)


def test_methods_outside_http_s_own_are_counted_as_other(api_url: str) -> None:
    """HTTP's parser takes any token as a method: each one a series of its own would let an
    anonymous client grow /metrics (and Prometheus) without end."""
    invented = f"X{uuid.uuid4().hex[:10].upper()}"
    answer = _raw(api_url, f"{invented} /api/jobs HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 405"), answer[:200]
    exposition = httpx.get(f"{api_url}/metrics", timeout=30).text
    assert invented not in exposition
    assert 'jobscope_api_requests_total{method="other",route="/api/jobs",status="4xx"}' in (
        exposition
    )
