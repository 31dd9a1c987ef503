"""Which network stream URLs a server may open, and URLs as they may be shown.

A server that opens any URL a visitor types can be made to reach the host's own private network
(server-side request forgery). So a `UrlPolicy` refuses every URL unless the operator turned URLs
on, refuses schemes other than the live ones and file paths, and refuses loopback, private,
link-local and other non-public addresses unless the operator named that host or network. The
host is resolved here, and every address it resolves to must pass; `addresses` gives those checked
addresses, so that a connection goes to what was checked (hermes/video/gate.py checks every URL
FFmpeg opens for a stream this way, and docs/design.md, "Live network streams", says why).
Credentials in a URL are never shown: `redact` is what the page, the log and /metrics get.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

# What FFmpeg reads live: RTSP cameras, RTMP and SRT from encoders, HTTP(S) for HLS playlists,
# MJPEG and progressive MP4.
LIVE_SCHEMES = ("rtsp", "rtsps", "rtmp", "srt", "http", "https")
_DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "rtmp": 1935, "http": 80, "https": 443}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class UrlRefused(ValueError):
    """A URL this server will not open; the message says why (without the URL's credentials)."""


def is_url(text: str) -> bool:
    """Whether `text` names a URL (scheme://...) rather than a file path."""
    return "://" in text.strip()[:16]


def redact(url: str) -> str:
    """`url` with any user name and password replaced by `***` (safe for the page, logs and metrics)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "<an unreadable URL>"
    if "@" not in parts.netloc:
        return url.strip()
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"***@{host}").geturl()


def split_live_url(url: str) -> SplitResult:
    """The parts of a live stream URL; UrlRefused for another scheme, a file path or no host."""
    text = url.strip()
    if not text:
        raise UrlRefused("no URL given")
    if not is_url(text):
        raise UrlRefused(f"'{redact(text)}' is not a URL (file paths are not opened from the network)")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise UrlRefused(f"'{redact(text)}' is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in LIVE_SCHEMES:
        raise UrlRefused(f"the scheme '{scheme}' is not a live stream (use one of {', '.join(LIVE_SCHEMES)})")
    if not parts.hostname:
        raise UrlRefused(f"'{redact(text)}' names no host")
    return parts


def default_port(parts: SplitResult) -> int | None:
    """The URL's port, or its scheme's usual one (SRT has none)."""
    return parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())


def _resolve(host: str) -> list[Address]:
    """Every address `host` resolves to; UrlRefused when it resolves to none."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise UrlRefused(f"the host '{host}' was not found ({exc.args[-1] if exc.args else exc})") from None
    return sorted({ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}, key=str)


def public(address: Address) -> bool:
    """Whether `address` is on the public internet (not loopback, private, link-local, multicast, ...)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class UrlPolicy:
    """What this server may open. `enabled` False refuses every URL (the default: a hosted app must
    be told). `allowed`: host names and networks (CIDR) the operator named; empty allows any public
    address, and with names, only those (private ones included, since the operator named them)."""

    enabled: bool = False
    allowed: tuple[str, ...] = ()
    # How host names are resolved: the system's resolver (a test gives its own, to play DNS answers).
    resolver: Callable[[str], Sequence[Address]] = field(default=_resolve, compare=False, repr=False)

    @classmethod
    def parse(cls, allow: str | None) -> UrlPolicy:
        """The policy of a command line's `--allow-urls [HOSTS]`: None (not given) refuses every URL;
        "" allows public addresses; "cam.local,10.0.0.0/8" allows exactly those hosts and networks."""
        if allow is None:
            return cls()
        names = tuple(n.strip().lower() for n in allow.split(",") if n.strip())
        for name in names:
            if "/" in name:
                try:
                    ipaddress.ip_network(name, strict=False)
                except ValueError as exc:
                    raise ValueError(f"--allow-urls: '{name}' is not a network ({exc})") from None
        return cls(True, names)

    def check(self, url: str, resolve: Callable[[str], Sequence[Address]] | None = None) -> str:
        """`url`, stripped, if this server may open it; UrlRefused with the reason otherwise."""
        host = self._host(url)
        if not self._named(host):
            self._check_addresses(host, (resolve or self.resolver)(host))
        return url.strip()

    def addresses(self, url: str) -> list[Address]:
        """The addresses of `url`'s host, resolved once, if this server may open it: a connection goes to
        one of these, never to a second answer of the resolver (DNS rebinding); UrlRefused otherwise."""
        host = self._host(url)
        found = list(self.resolver(host))
        if not self._named(host):
            self._check_addresses(host, found)
        return found

    def _host(self, url: str) -> str:
        if not self.enabled:
            raise UrlRefused("this server does not open network streams (start it with --allow-urls to allow them)")
        return split_live_url(url).hostname.lower()

    def _named(self, host: str) -> bool:
        return bool(self.allowed) and host in self.allowed

    def _check_addresses(self, host: str, addresses: Sequence[Address]) -> None:
        for address in addresses:
            if self.allowed:
                if not any(address in net for net in self._networks()):
                    raise UrlRefused(f"the host '{host}' is not among those this server allows")
            elif not public(address):
                raise UrlRefused(
                    f"the host '{host}' is a private or local address ({address}); this server opens it only "
                    "if it is started with --allow-urls naming it"
                )

    def _networks(self) -> list[Network]:
        out = []
        for name in self.allowed:
            try:
                out.append(ipaddress.ip_network(name, strict=False))
            except ValueError:  # a host name: matched by name above
                continue
        return out
