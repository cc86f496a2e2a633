"""A server address given on the command line (`loadgen --url`, `monitor --url`), checked before any connection.

Why: `urlsplit` accepts nearly anything ('not a url' becomes host 'not a url'), and the failure then surfaces deep
in http.client as an InvalidURL traceback, or as a bad port's ValueError. Here the scheme, host and port are
checked once and a bad address is one ProfileError line naming the flag."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

from profiler.errors import ProfileError

_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62}))*\.?$")
_EXAMPLE = "e.g. http://127.0.0.1:8000/v1"


def server_url(url: str, flag: str = "--url") -> SplitResult:
    """`url` (a scheme-less 'host:port/path' means http) split and checked: http or https, a DNS name or IP
    address, a port in 1..65535, no spaces or control characters. One ProfileError line otherwise."""
    def bad(why: str) -> ProfileError:
        return ProfileError(f"{flag} {url[:200]!r}: {why}; give the server's address, {_EXAMPLE}")

    if not url or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise bad("an address has no spaces or control characters" if url else "empty")
    try:
        u = urlsplit(url if "://" in url else "http://" + url)
    except ValueError as e:  # an unbalanced or non-IP [bracketed] host
        raise bad(str(e).rstrip(".")) from None
    if u.scheme not in ("http", "https"):
        raise bad(f"scheme {u.scheme!r} is not http or https")
    host = u.hostname or ""
    if not host:
        raise bad("no host")
    if ":" in host:  # an IPv6 literal ([::1])
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise bad(f"{host!r} is not an IPv6 address") from None
    elif not _HOST.match(host):
        raise bad(f"{host!r} is not a host name or IP address")
    try:
        port = u.port
    except ValueError:
        raise bad("the port is not a number in 1..65535") from None
    if port == 0:
        raise bad("the port is not a number in 1..65535")
    return u
