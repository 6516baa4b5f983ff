"""Allowed hosts: which names the dashboard answers to (as Django's ALLOWED_HOSTS).

A page on a name the attacker owns can have that name resolve to 127.0.0.1
(DNS rebinding); the browser then sends that name in ``Host`` and treats the
dashboard as the attacker's own origin. Refusing every Host that is not
allowed closes it. Pure functions here, so the settings check refuses a bad
entry when the config is built and the web layer (:mod:`wurk.web.hosts`)
matches with the same rules.

Duties:
1. :func:`host_of`: the host part of a ``Host`` header or an Origin's netloc,
   normalised (lower case, one trailing dot dropped, an IPv6 address in its
   compressed form in brackets, the port dropped), or None when it is not
   the syntax of a host: anything with ``@``, a space, a path, a zone id.
2. :func:`parse_pattern`: one allowed-hosts entry, normalised: a host, a
   ``.example.com`` (that domain and every subdomain, Django's form), a
   ``*.example.com`` (subdomains only, Starlette's form) or ``*`` (every
   host: the check is off); ValueError says what is wrong.
3. :class:`AllowedHosts`: a list of entries and :meth:`AllowedHosts.allows`;
   :func:`bind_pattern` turns ``wurk web --bind``'s address into an entry
   (None for a wildcard address, which names no host).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ALL = "*"
# A name's characters (RFC 3986 reg-name without percent-escapes or sub-delims):
# letters, digits, "-", "_" and "." between labels; a port is digits only.
_HOST = re.compile(r"(?P<host>[a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{0,5}))?")
_MAX_NAME = 253
_FORMS = ("a host name or address (example.com, 10.0.0.5, [::1]), .example.com, "
          "*.example.com or *")


def host_of(text: str) -> str | None:
    """The normalised host part of ``host[:port]``; None when malformed."""
    found = _HOST.fullmatch(text.lower())
    if found is None:
        return None
    host = found.group("host")
    if host.startswith("["):
        return _ipv6(host[1:-1])
    # One trailing dot is the same name fully qualified (Django drops it too).
    host = host.removesuffix(".")
    if not host or len(host) > _MAX_NAME or host.startswith(".") or host.endswith(".") \
            or ".." in host:
        return None
    return host


def _ipv6(text: str) -> str | None:
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    return f"[{address.compressed}]"


def parse_pattern(raw: str) -> str:
    """One allowed-hosts entry, normalised; ValueError says what it must be (the
    caller quotes the entry)."""
    text = raw.strip().lower()
    if text == ALL:
        return ALL
    prefix = next((p for p in ("*.", ".") if text.startswith(p)), "")
    rest = text[len(prefix):]
    if not prefix and _bare_ipv6(rest):
        rest = f"[{rest}]"
    host = host_of(rest)
    if host is None or (prefix and host.startswith("[")):
        raise ValueError(f"must be {_FORMS}")
    if ":" in rest.rpartition("]")[2]:
        raise ValueError("must name a host without a port (every port matches)")
    return prefix + host


def _bare_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def bind_pattern(address: str) -> str | None:
    """``--bind``'s address as an entry; None for 0.0.0.0, :: or an empty address."""
    text = address.strip().strip("[]")
    try:
        if ipaddress.ip_address(text).is_unspecified:
            return None
    except ValueError:
        if not text:
            return None
    return parse_pattern(text)


@dataclass(frozen=True)
class AllowedHosts:
    """Normalised entries (see :func:`parse_pattern`)."""

    patterns: tuple[str, ...]

    @classmethod
    def of(cls, entries: Iterable[str]) -> AllowedHosts:
        """From raw entries, each checked (ValueError quoting the first bad one)."""
        unique: dict[str, None] = {}
        for entry in entries:
            try:
                unique[parse_pattern(entry)] = None
            except ValueError as exc:
                raise ValueError(f"allowed host {entry!r} {exc}") from None
        return cls(tuple(unique))

    @property
    def everything(self) -> bool:
        return ALL in self.patterns

    def allows(self, host: str) -> bool:
        """Whether the normalised ``host`` (from :func:`host_of`) matches an entry."""
        return any(_matches(host, pattern) for pattern in self.patterns)


def _matches(host: str, pattern: str) -> bool:
    if pattern == ALL:
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    if pattern.startswith("."):
        return host == pattern[1:] or host.endswith(pattern)
    return host == pattern
