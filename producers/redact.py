"""Device URLs as logs may show them: without the credentials they can carry.

A devices file may put a password in a URL (`ipmi://root:secret@bmc/`), an SNMP community
before the host (`snmp://private@pdu/...`, the community is its password) or a secret in the
query (`?password=`, `?community=`, `?token=`); none of them may reach a log line.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

MASK = "***"
# Query parameters whose value is a credential.
SECRET_PARAMS = re.compile(r"pass|community|secret|token|key|auth|priv|cred", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its user part (`user:***@`, or `***@` when the user part alone is the
    secret, as an SNMP community) and its credential query values masked."""
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError:
        return MASK  # cannot tell its credentials apart: show none of it
    head, sep, tail = url.partition("?")
    if username is not None or password is not None:
        user = f"{username}:{MASK}" if password is not None else MASK
        head = head.replace(parts.netloc, f"{user}@{parts.netloc.rpartition('@')[2]}", 1)
    if sep:
        query, hash_sign, fragment = tail.partition("#")
        pairs = parse_qsl(query, keep_blank_values=True)
        masked = [(k, MASK if SECRET_PARAMS.search(k) else v) for k, v in pairs]
        tail = urlencode(masked, safe="*") + hash_sign + fragment
    return head + sep + tail


def redact_text(text: str, url: str) -> str:
    """`text` (an error message about `url`) without `url`'s credentials anywhere in it."""
    text = text.replace(url, redact_url(url))
    for secret in _secrets(url):
        text = text.replace(secret, MASK)
    return text


def _secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
        found = [parts.password, parts.username if parts.password is None else None]
    except ValueError:
        return [url]
    found += [v for k, v in parse_qsl(parts.query) if SECRET_PARAMS.search(k)]
    found += [unquote(value) for value in found if value]
    return [value for value in found if value and len(value) >= 3]
