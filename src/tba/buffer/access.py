"""Who may change the buffer, and what of its secrets may be shown: the bearer-token check
both transports share (gRPC metadata, REST header) and the redaction of store URLs. Pure."""

from __future__ import annotations

import hmac
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import SecretStr

AUTHORIZATION = "authorization"
NO_TOKEN_WARNING = (
    "buffer.auth_token is not set: gRPC calls and REST writes are unauthenticated; "
    "set TBA_BUFFER__AUTH_TOKEN (and TBA_CLIENT__AUTH_TOKEN on clients) on any shared network"
)
_SECRET_QUERY_KEYS = {"password", "username"}


def bearer_header(token: SecretStr) -> str:
    """The `authorization` value that carries `token`."""
    return f"Bearer {token.get_secret_value()}"


def bearer_authorizes(header: str | None, token: SecretStr) -> bool:
    """Whether an `authorization` value carries `token`, compared in constant time."""
    scheme, _, presented = (header or "").partition(" ")
    expected = token.get_secret_value().encode()
    matches = hmac.compare_digest(presented.strip().encode(), expected)
    return scheme.lower() == "bearer" and matches


def redact_url(url: str) -> str:
    """`url` with its user, password and credential query parameters replaced by `***`."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = urlencode(
        [(k, "***" if k in _SECRET_QUERY_KEYS else v) for k, v in parse_qsl(parts.query)],
        safe="*",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
