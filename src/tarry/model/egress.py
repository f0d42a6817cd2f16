"""Which addresses a route put through the API may deliver to (server-side request forgery).

A token that may put a route could otherwise make the server POST to what only the server
reaches: services on its own loopback, a cloud's metadata endpoint (``169.254.169.254``, which
hands out credentials), the private network behind it. ``EgressPolicy`` refuses such
destinations when the route is put (an address literal, a name that is local by definition such
as ``localhost``, and, in ``tarry.transports.egress``, what a name resolves to then) and at
every connection, after DNS resolution, so a name that re-resolves to a refused address is
caught too. The operator opens exceptions
with ``[egress] allow`` (host names, addresses, CIDR blocks).

Refused: every address that is not globally routable (loopback, link-local, private, shared
address space, documentation and reserved blocks, unspecified), and multicast; an IPv6 address
that embeds an IPv4 one (mapped, NAT64, 6to4) is judged by the IPv4 address it carries.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tarry.errors import ForbiddenAddress, InvalidArgument

__all__ = ["ALLOW_ALL", "EgressPolicy", "parse_allow_entry"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Names that are local by definition (RFC 6761) or a cloud's metadata service.
_LOCAL_NAMES = frozenset({"localhost", "metadata", "metadata.google.internal"})
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_WHAT_TO_CONFIGURE = (
    "to allow it, add the host or its network to [egress] allow in tarry.toml "
    '(e.g. allow = ["{host}"]) and restart'
)


def parse_allow_entry(entry: str) -> str | IPNetwork:
    """One ``[egress] allow`` entry: an address or CIDR block (as a network), else a host name
    (lower case, exact). Raises ``invalid_argument`` for an entry that is neither."""
    text = entry.strip().lower()
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        pass
    labels = text.rstrip(".").split(".")
    if not text or any(not label or not label.replace("-", "").isalnum() for label in labels):
        raise InvalidArgument(
            f"egress allow entry {entry!r} is neither an address, a CIDR block (10.0.0.0/8) "
            "nor a host name"
        )
    return text.rstrip(".")


def _embedded_v4(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4), else ``ip`` itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def refused_kind(ip: IPAddress) -> str | None:
    """Why ``ip`` is refused by default (``loopback``, ``link-local (cloud metadata)``, ...),
    or None for a globally routable unicast address."""
    ip = _embedded_v4(ip)
    for kind, hit in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local (where cloud metadata services answer)", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        ("not globally routable", not ip.is_global),
    ):
        if hit:
            return kind
    return None


def _literal(host: str) -> IPAddress:
    """``host`` as an address, also in the short IPv4 forms a resolver accepts (``127.1``,
    ``0x7f000001``, ``2130706433``); ValueError for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            raise ValueError(host) from None


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """``allow_all``: no guard (the operator's own routes, or a server without tokens);
    otherwise ``hosts`` (exact names) and ``networks`` are the operator's exceptions."""

    allow_all: bool = False
    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_entries(cls, entries: Iterable[str], *, allow_all: bool = False) -> EgressPolicy:
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in entries:
            parsed = parse_allow_entry(entry)
            if isinstance(parsed, str):
                hosts.add(parsed)
            else:
                networks.append(parsed)
        return cls(allow_all=allow_all, hosts=frozenset(hosts), networks=tuple(networks))

    def host_allowed(self, host: str) -> bool:
        """True when ``host`` (a name) is exempt as a whole: every address it resolves to."""
        return self.allow_all or host.lower().rstrip(".") in self.hosts

    def check_address(self, host: str, ip: IPAddress) -> None:
        """Raise ``forbidden_address`` when connecting to ``ip`` (resolved from ``host``) is
        refused."""
        if self.host_allowed(host) or any(ip in net for net in self.networks):
            return
        kind = refused_kind(ip)
        if kind is not None:
            shown = host if host == str(ip) else f"{host} ({ip})"
            raise ForbiddenAddress(
                f"route destination {shown} is a {kind} address, which routes put through the "
                f"API may not reach; {_WHAT_TO_CONFIGURE.format(host=host)}",
                address=str(ip),
            )

    def check_url(self, url: str) -> None:
        """What can be known before any lookup: an address literal, or a name that is local by
        definition. A name is checked again at every connection, once it is resolved."""
        if self.allow_all:
            return
        host = (urlsplit(url).hostname or "").lower().rstrip(".")
        try:
            ip = _literal(host)
        except ValueError:
            if host in _LOCAL_NAMES or host.endswith(".localhost"):
                if not self.host_allowed(host):
                    raise ForbiddenAddress(
                        f"route destination {host} is a local name, which routes put through "
                        f"the API may not reach; {_WHAT_TO_CONFIGURE.format(host=host)}",
                        address=host,
                    ) from None
            return
        self.check_address(host, ip)


#: No guard: the operator's own routes (``tarry.toml``) and a server without tokens.
ALLOW_ALL = EgressPolicy(allow_all=True)
