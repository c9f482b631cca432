"""What a scenario puts on the wire besides bodies: the base URL (its user and password never
shown) and the headers (nothing that would add headers of its own, or that HTTP cannot carry)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"
# scheme://user:password@host, and user:password@host without a scheme
_USERINFO = re.compile(r"(?P<scheme>(?:[A-Za-z][A-Za-z0-9+.-]*://)|^)(?P<userinfo>[^/@\s]+)@")


def redact_url(text: str) -> str:
    """A URL (or any text holding URLs) without the user and password parts."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``http://user:pw@host/v1`` -> (``http://host/v1``, ``user:pw``); a URL without them as is."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=hostport)), userinfo


def base_url_problem(url: str) -> str | None:
    """Why ``url`` is not a server's base URL, in words that never repeat its password; None if it is."""
    shown = redact_url(url)
    if not url.startswith(("http://", "https://")):
        return f"must start with http:// or https:// (got {shown!r})"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError as exc:
        why = "the port must be a number from 1 to 65535" if "port" in str(exc).lower() else f"not a URL ({exc})"
        return f"{shown}: {why}"
    if not parts.hostname:
        return f"{shown}: no host; e.g. http://127.0.0.1:8000/v1"
    if any(c in url for c in "\r\n\t\0 "):
        return f"{shown}: a URL holds no spaces or line breaks"
    return None


# a header value written as ${NAME}: read from that environment variable when requests are made
ENV_REF = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}$")


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def header_problem(name: str, value: str) -> str | None:
    """Why a header cannot be sent as given (a line break would add headers of its own)."""
    if any(c in name for c in "\r\n\0:") or not name.strip():
        return f"header name {name!r}: not a header name"
    if any(c in value for c in "\r\n\0"):
        return f"header {name}: its value holds a line break or NUL; give the value alone"
    if not (name.isascii() and value.isascii() or _latin1(name + value)):
        return f"header {name}: it holds characters an HTTP header cannot carry (beyond Latin-1); encode or drop them"
    if value == REDACTED:
        return (f"header {name}: {REDACTED} stands where loadgen wrote down a secret; put the value back, "
                f"or give it with --set target.headers.{name}=VALUE")
    return None
