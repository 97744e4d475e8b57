"""Outbound requests under one policy: what a run's reward servers (and, later, webhooks) may reach.

A URL's host is resolved once, every address it resolves to is checked, and the request connects to that
checked address (the Host header and TLS server name stay the URL's host, so certificates still verify):
no second lookup that DNS rebinding could answer differently. Refused unless an admin lists them
(`POSTTRAIN_HTTP_ALLOW`: hosts, addresses or CIDRs, optionally `host:port`): loopback, link-local, private,
shared, multicast, unspecified and reserved addresses (anything not globally routable, IPv4 inside IPv6
included), and the cluster's own addresses (this machine's interfaces, and the hosts the platform names in
`POSTTRAIN_HTTP_DENY`: itself, Ray, its database and broker). Redirects are never followed; an answer is
bounded in size and the whole exchange in time; errors give the status and size of an answer, never its
body, which may be anything the server chose to send.

Standard library only (plus psutil, which Ray brings, for the interface addresses): the engine imports it,
and the platform uses it to check a URL when a reward is registered.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Literal

ALLOW_ENV = "POSTTRAIN_HTTP_ALLOW"
DENY_ENV = "POSTTRAIN_HTTP_DENY"
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
_READ_CHUNK = 64 * 1024

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class OutboundRefused(Exception):
    """The policy refuses the URL (the message says which rule); retrying cannot help."""


class OutboundFailed(Exception):
    """The request could not be made or completed (DNS, connection, time, size); may be worth a retry."""


@dataclass(frozen=True)
class Target:
    """A checked URL: connect to `address`, speak to `host`."""

    scheme: str
    host: str
    port: int
    path: str  # path and query, as the request line sends it
    address: str


@dataclass(frozen=True)
class Response:
    status: int
    reason: str
    body: bytes


@dataclass(frozen=True)
class _Entry:
    host: str | None
    network: Network | None
    port: int | None

    def matches(self, host: str, address: Address, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return address in self.network
        return self.host == host


class OutboundPolicy:
    def __init__(self, allow: Iterable[str] = (), deny: Iterable[str] = (), *, own_addresses: bool = True):
        self.allow = [_entry(item) for item in allow]
        self.deny = [_entry(item) for item in deny]
        self.own_addresses = own_addresses

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OutboundPolicy:
        """The policy the platform handed to this run (or the machine's defaults: nothing extra allowed)."""
        env = os.environ if environ is None else environ
        return cls(_items(env.get(ALLOW_ENV, "")), _items(env.get(DENY_ENV, "")))

    def check_url(self, url: str, resolve: bool | Literal["if_possible"] = True) -> Target:
        """The URL's checked target; raises OutboundRefused naming the rule. `resolve="if_possible"` (at
        registration) accepts a host that does not resolve now: it is checked again at every request."""
        parsed = urllib.parse.urlsplit(url or "")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise OutboundRefused("must be an http:// or https:// URL with a host")
        if parsed.username is not None or parsed.password is not None:
            raise OutboundRefused("must not carry credentials (user:password@); send them in a header")
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
        except ValueError:
            raise OutboundRefused("has a port that is not a number between 0 and 65535") from None
        host = parsed.hostname.lower().rstrip(".")
        path = urllib.parse.urlunsplit(("", "", parsed.path or "/", parsed.query, ""))
        try:
            addresses = _resolve(host, port)
        except OutboundFailed:
            if resolve == "if_possible":
                return Target(parsed.scheme, host, port, path, "")
            raise
        for address in addresses:
            self._check(host, address, port)
        return Target(parsed.scheme, host, port, path, str(addresses[0]))

    def _check(self, host: str, address: Address, port: int) -> None:
        if any(entry.matches(host, address, port) for entry in self.allow):
            return
        plain = _embedded_ipv4(address) or address  # where an IPv6 address that carries an IPv4 one really goes
        allow = f"an admin may allow it ({ALLOW_ENV})"
        for checked in (plain, address):  # the IPv4 one it carries says where it really goes
            kind = _not_public(checked)
            if kind:
                article = "an" if kind[0] in "aeiou" else "a"
                raise OutboundRefused(f"{host} resolves to {address}, {article} {kind} address; {allow}")
        if any(entry.matches(host, plain, port) or entry.matches(host, address, port) for entry in self.deny):
            raise OutboundRefused(f"{host} is the cluster's own address {address}; {allow}")
        if self.own_addresses and (address in local_addresses() or plain in local_addresses()):
            raise OutboundRefused(f"{host} is this machine's own address {address}; {allow}")
        if any(_resolves_to(entry.host, address) for entry in self.deny if entry.host is not None):
            raise OutboundRefused(f"{host} is the cluster's own address {address}; {allow}")


def post(
    target: Target,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout_s: float,
    max_bytes: int = MAX_RESPONSE_BYTES,
) -> Response:
    """POST `body` to a checked target, connecting to its address; the whole exchange ends within `timeout_s`
    (a watchdog closes the socket), an answer over `max_bytes` is refused, redirects are returned as they are.
    Raises OutboundFailed with a message that never quotes the answer."""
    if not target.address:
        raise OutboundFailed(f"{target.host} was never resolved")
    deadline = time.monotonic() + timeout_s
    connection = _connection(target, timeout_s)
    watchdog = threading.Timer(timeout_s, _abort, args=(connection,))
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.request("POST", target.path, body=body, headers=dict(headers))
        response = connection.getresponse()
        length = response.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise OutboundFailed(
                f"HTTP {response.status}: a {int(length)}-byte answer, over the {max_bytes}-byte limit"
            )
        return Response(response.status, response.reason, _read_capped(response, deadline, max_bytes))
    except OutboundFailed:
        raise
    except TimeoutError:
        raise OutboundFailed(f"timed out after {timeout_s:g}s") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if time.monotonic() >= deadline:
            raise OutboundFailed(f"timed out after {timeout_s:g}s") from None
        raise OutboundFailed(f"{type(exc).__name__}: {_short(exc)}") from None
    finally:
        watchdog.cancel()
        connection.close()


def _read_capped(response: http.client.HTTPResponse, deadline: float, max_bytes: int) -> bytes:
    """The answer's body, read a chunk at a time: TimeoutError past `deadline`, OutboundFailed over `max_bytes`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = response.read1(_READ_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise OutboundFailed(f"HTTP {response.status}: the answer went over the {max_bytes}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


# --- addresses ---------------------------------------------------------------------------------------------


def _items(text: str) -> list[str]:
    return [item for item in text.replace(",", " ").split() if item]


def _entry(item: str) -> _Entry:
    """`host`, `host:port`, `1.2.3.4`, `1.2.3.4:80`, `[::1]:80`, `::1`, or a CIDR `10.0.0.0/8`."""
    text = item.strip().lower()
    port: int | None = None
    if text.startswith("["):
        inner, _, rest = text[1:].partition("]")
        text, port = inner, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    elif text.count(":") == 1:
        head, _, tail = text.partition(":")
        if tail.isdigit():
            text, port = head, int(tail)
    try:
        return _Entry(None, ipaddress.ip_network(text, strict=False), port)
    except ValueError:
        return _Entry(text.rstrip("."), None, port)


def _resolve(host: str, port: int) -> list[Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OutboundFailed(f"cannot resolve {host} ({_short(exc)})") from None
    found: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise OutboundFailed(f"{host} resolves to no address")
    return found


def _resolves_to(host: str, address: Address) -> bool:
    try:
        return address in _resolve(host, 0)
    except OutboundFailed:
        return False


def _embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4, Teredo), which is where it really goes."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in ipaddress.ip_network("64:ff9b::/96"):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def _not_public(address: Address) -> str | None:
    """Which kind of non-public address this is, or None for a globally routable one."""
    checks = (
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("non-global", not address.is_global),
    )
    return next((kind for kind, hit in checks if hit), None)


@cache
def local_addresses() -> frozenset[Address]:
    """Every address of this machine's interfaces (a reward must not call back into the cluster)."""
    found: set[Address] = set()
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            for entry in addresses:
                if entry.family in (socket.AF_INET, socket.AF_INET6):
                    found.add(ipaddress.ip_address(entry.address.split("%", 1)[0]))
    except Exception:  # no psutil, or an interface it cannot read: the host name's addresses at least
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.add(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
    except OSError:
        pass
    return frozenset(found)


# --- the connection ----------------------------------------------------------------------------------------


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, target: Target, timeout_s: float):
        super().__init__(target.host, target.port, timeout=timeout_s)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, target: Target, timeout_s: float):
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout_s, context=self._tls)
        self._address = target.address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)  # SNI and the certificate: the URL's host


def _connection(target: Target, timeout_s: float) -> http.client.HTTPConnection:
    return _PinnedHTTPS(target, timeout_s) if target.scheme == "https" else _PinnedHTTP(target, timeout_s)


def _abort(connection: http.client.HTTPConnection) -> None:
    """The deadline passed: wake whatever read or write is blocked on the socket."""
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."
