"""Egress: find the URLs and hosts a text points at and check them against allow/deny lists.

Hosts are compared the way a browser would resolve them (WHATWG URL parsing), so that a
disguised URL cannot slip past a list:

- the host is what follows the *last* `@` of the authority: `https://good.com@evil.com` goes to
  `evil.com`; for http(s)/ws(s)/ftp a backslash ends the authority like a slash
  (`https://evil.com\\@good.com` goes to `evil.com`) and any number of slashes may follow the
  scheme (`https:/\\evil.com`);
- hosts are percent-decoded, lower-cased, stripped of trailing dots, ideographic full stops
  become dots, and internationalised names become punycode (`bücher.de` → `xn--bcher-kva.de`),
  so a look-alike host never equals the ASCII name it imitates (the stdlib IDNA 2003 codec is
  used; a name with one of the characters where it and browsers differ, such as `ß`, is kept
  as written and so matches no ASCII entry);
- IPv4 hosts in any form a resolver accepts (`2130706433`, `0x7f.1`, `0177.0.0.1`) become a dotted
  quad and IPv6 literals are compressed; IPv4-mapped IPv6 addresses match IPv4 entries;
- ports: an entry with a port (`api.example.com:8443`) matches only that port (the scheme's
  default port counts); an entry without one matches any port.

List entries: `example.com` (exactly that host), `*.example.com` (any subdomain, not the apex,
as in TLS certificates), `.example.com` (the apex and any subdomain), `*` (everything), an IP
address, a CIDR network (`10.0.0.0/8`), or a URL (its host and explicit port are used). Deny
wins over allow. `allow=None` means no allow list; `allow=[]` allows nothing.

In free text, URLs with a scheme are always found; bare hosts are found when they start with
`www.`, or end in a common TLD that is not also a common file extension (`.com`, `.io`, `.ai`,
… but not `.py`, `.md`, `.sh`), or are an IPv4 address followed by a port or path. E-mail
domains are not URLs. A text that is a single host-like word (`internal.corp:8080`) is taken as
one URL.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Sequence
from urllib.parse import unquote

import msgspec

from aap_server.guardian.detectors._spans import DisjointSpans
from aap_server.guardian.detectors.base import Category, Finding

EGRESS_IDS = ("egress.denied_domain", "egress.not_allowed_domain")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class UrlMatch(msgspec.Struct, frozen=True, kw_only=True):
    """A URL or bare host found in a text, with its normalised destination."""

    start: int
    end: int
    url: str
    host: str
    port: int | None


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_SCHEME_TAIL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}\Z")
_AUTHORITY_END = re.compile(r"[/?#]")
_SPECIAL_AUTHORITY_END = re.compile(r"[/\\?#]")
_FULL_STOPS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})
_DECIMAL = re.compile(r"[0-9]+")
_HEXNUM = re.compile(r"0[xX][0-9a-fA-F]*")
_OCTAL = frozenset("01234567")
_IDNA_DEVIATIONS = frozenset("\u00df\u03c2\u200c\u200d")  # ß, final sigma, ZWNJ, ZWJ


def _ipv4_number(part: str) -> int | None:
    if _HEXNUM.fullmatch(part):
        return int(part[2:] or "0", 16)
    if not _DECIMAL.fullmatch(part):
        return None
    if len(part) > 1 and part[0] == "0":
        return int(part, 8) if set(part) <= _OCTAL else None
    return int(part)


def _whatwg_ipv4(host: str) -> str | None:
    """The dotted quad a WHATWG URL parser makes of a numeric host, or None if not numeric."""
    parts = host.split(".")
    if not parts[-1] or not (_DECIMAL.fullmatch(parts[-1]) or _HEXNUM.fullmatch(parts[-1])):
        return None
    if len(parts) > 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    nums = [n for n in numbers if n is not None]
    if any(n > 255 for n in nums[:-1]) or nums[-1] >= 256 ** (5 - len(nums)):
        return None
    value = nums[-1]
    for i, n in enumerate(nums[:-1]):
        value += n << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))


def normalize_host(raw: str) -> str:
    """Lower-case, percent-decoded, no trailing dot, punycode, canonical IP (no brackets)."""
    host = unquote(raw).translate(_FULL_STOPS).strip().lower()
    if host.startswith("[") and host.endswith("]"):
        try:
            return ipaddress.IPv6Address(host[1:-1].split("%", 1)[0]).compressed
        except ValueError:
            return host
    host = host.rstrip(".")
    if not host.isascii():
        if any(ch in _IDNA_DEVIATIONS for ch in host):
            return host  # browsers and IDNA 2003 disagree on these: match nothing but itself
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            return host
    quad = _whatwg_ipv4(host)
    return quad if quad is not None else host


def _split_host_port(authority: str) -> tuple[str, int | None] | None:
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        close = hostport.find("]")
        if close == -1:
            return None
        host, rest = hostport[: close + 1], hostport[close + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_text = hostport.rpartition(":")
        if not sep:
            host, port_text = hostport, ""
    if port_text and not port_text.isdigit():
        return None
    port = int(port_text) if port_text else None
    return (host, port) if host else None


def parse_destination(url: str, *, bare: bool = False) -> tuple[str, int | None] | None:
    """(normalised host, port) that a URL points at; `bare` for `host[:port][/path]` without a
    scheme. The port is the explicit one, else the scheme's default, else None."""
    scheme = ""
    if bare:
        authority = _SPECIAL_AUTHORITY_END.split(url.lstrip("/"), maxsplit=1)[0]
    else:
        scheme_match = _SCHEME.match(url)
        if scheme_match is None:
            return None
        scheme = scheme_match.group(1).lower()
        rest = url[scheme_match.end() :]
        if scheme in _DEFAULT_PORTS:  # WHATWG "special" schemes: `\\` is `/`, slashes optional
            authority = _SPECIAL_AUTHORITY_END.split(rest.lstrip("/\\"), maxsplit=1)[0]
        elif rest.startswith("//"):
            authority = _AUTHORITY_END.split(rest[2:], maxsplit=1)[0]
        else:
            return None
    split = _split_host_port(authority)
    if split is None:
        return None
    host, port = split
    normalized = normalize_host(host)
    if not normalized:
        return None
    return normalized, port if port is not None else _DEFAULT_PORTS.get(scheme)


# --- finding URLs in text ----------------------------------------------------------------

_SCHEME_SEP = re.compile(r":[/\\]{1,3}")
_URL_BODY = re.compile(r"[^\s<>\"'`]*")
_TRAILING = ".,;:!?'\")]}>*"
_BARE_TLDS_WORDS = (
    "com net org io ai dev app co me info biz xyz us uk de fr nl eu ca au jp cn ru in br "
    "it es ch se no dk fi cz at be ie nz sg hk kr tw il za mx ar gov edu mil int cloud "
    "site online tech store shop blog news live link click top club space website pro tv "
    "cc gg ly to ws fm tk ml ga cf gq su ua tr ir pk vn id th my ph cl pe ve gr pt ro hu "
    "bg sk si hr lt lv ee is lu li mc page email host zone network digital agency studio "
    "design"
)  # not rs, py, md, sh, pl, ...: file extensions

_BARE_TLDS = frozenset(_BARE_TLDS_WORDS.split())
_BARE_SHAPES = (re.compile(rb"a\.aa"), re.compile(rb"0\.aa"))
_HOST_CHARS = re.compile(r"[A-Za-z0-9.-]*")
_BARE_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24})\.?(?![A-Za-z0-9-])"
    r"(?::\d{1,5})?"
)
# A host name is at most 253 characters (plus a port): the host match is bounded to that
# window, so a long run of label-like text (`eyJa.eyJa.…`) costs each candidate O(1), not the
# rest of the text. The path of an accepted host is taken after it (linear, once per host).
_BARE_HOST_WINDOW = 253 + 1 + 6
_BARE_PATH = re.compile(r"[/?#][^\s<>\"'`]*")
# How many candidates are looked at between two `should_stop` questions.
_STOP_EVERY = 256
_BARE_IPV4 = re.compile(
    r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5}(?:[/?#][^\s<>\"'`]*)?|[/?#][^\s<>\"'`]*)"
)
_SHAPE = bytes(
    0x30 if 0x30 <= i <= 0x39 else 0x61 if (0x41 <= i <= 0x5A or 0x61 <= i <= 0x7A) else i
    for i in range(256)
)
_SINGLE_HOST = re.compile(r"[^\s/@]+\.[^\s/@]+(?:[/?#]\S*)?")


def _trim(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1] in _TRAILING:
        if text[end - 1] == ")" and text.count("(", start, end) >= text.count(")", start, end):
            break
        end -= 1
    return end


def _add(found: list[UrlMatch], text: str, start: int, end: int, *, bare: bool) -> None:
    url = text[start:end]
    dest = parse_destination(url, bare=bare)
    if dest is not None:
        found.append(UrlMatch(start=start, end=end, url=url, host=dest[0], port=dest[1]))


def find_urls(text: str, should_stop: Callable[[], bool] | None = None) -> list[UrlMatch]:
    """URLs (with a scheme) and bare hosts in `text`, in order, with normalised hosts.
    `should_stop` is asked every few hundred candidates: once it says so, the search ends
    and returns what it found so far (the caller, who asked to stop, must not rely on it)."""
    found: list[UrlMatch] = []
    covered_until = -1
    countdown = _STOP_EVERY

    def stop() -> bool:
        nonlocal countdown
        countdown -= 1
        if countdown:
            return False
        countdown = _STOP_EVERY
        return should_stop is not None and should_stop()

    if ":" in text:
        for sep in _SCHEME_SEP.finditer(text):
            if stop():
                return found
            if sep.start() < covered_until:
                continue
            scheme = _SCHEME_TAIL.search(text, max(0, sep.start() - 31), sep.start())
            if scheme is None:
                continue
            if sep.group() != "://" and scheme.group().lower() not in _DEFAULT_PORTS:
                continue
            body = _URL_BODY.match(text, sep.end())
            end = _trim(text, scheme.start(), body.end() if body else sep.end())
            if end > sep.end():
                _add(found, text, scheme.start(), end, bare=False)
                covered_until = end
    taken = DisjointSpans()
    for u in found:
        taken.add(u.start, u.end)
    bare: list[tuple[int, int]] = []
    shape = text.encode("ascii", "replace").translate(_SHAPE)
    for pattern in _BARE_SHAPES:
        for cand in pattern.finditer(shape):
            if stop():
                return found
            if taken.overlaps(cand.start(), cand.start() + 1):
                continue  # inside a host or URL already found
            # The host's left edge, matched on the reversed stretch before the candidate (a
            # `[...]*\Z` search would retry from every position of the window).
            low = max(0, cand.start() - 253)
            left = _HOST_CHARS.match(text[low : cand.start()][::-1])
            start = cand.start() - (left.end() if left else 0)
            while start < cand.start() and text[start] in ".-":
                start += 1
            if taken.overlaps(start, start + 1):
                continue
            if start > 0 and text[start - 1] in "@/\\:._-":
                continue  # an e-mail domain, or part of a path or a URL already found
            m = _BARE_HOST.match(text, start, start + _BARE_HOST_WINDOW)
            if m is None or m.end() <= cand.start():
                continue
            tld = m.group(1).lower()
            if tld in _BARE_TLDS or text[start : start + 4].lower() == "www.":
                path = _BARE_PATH.match(text, m.end())
                end = _trim(text, start, path.end() if path else m.end())
                if not taken.overlaps(start, end):
                    taken.add(start, end)
                    bare.append((start, end))
    if "." in text:
        for m in _BARE_IPV4.finditer(text):
            if stop():
                return found
            end = _trim(text, m.start(), m.end())
            if not taken.overlaps(m.start(), end):
                taken.add(m.start(), end)
                bare.append((m.start(), end))
    for start, end in bare:
        _add(found, text, start, end, bare=True)
    if not found and _SINGLE_HOST.fullmatch(text.strip()):
        stripped = text.strip()
        offset = text.find(stripped)
        _add(found, text, offset, offset + len(stripped), bare=True)
    found.sort(key=lambda u: u.start)
    return found


# --- allow / deny lists ------------------------------------------------------------------


class HostPattern(msgspec.Struct, frozen=True):
    """One allow/deny list entry, parsed (see the module docstring for the syntax)."""

    entry: str
    kind: str  # "any" | "exact" | "subdomains" | "domain" | "network"
    host: str = ""
    port: int | None = None
    network: str = ""

    @classmethod
    def parse(cls, entry: str) -> HostPattern:
        raw = entry.strip()
        if raw == "*":
            return cls(entry, "any")
        port: int | None = None
        if "://" in raw or (raw.startswith("[") and "]:" in raw) or raw.count(":") == 1:
            authority = raw.split("://", 1)[-1]
            split = _split_host_port(_SPECIAL_AUTHORITY_END.split(authority, maxsplit=1)[0])
            if split is not None:
                raw, port = split
        try:
            net = ipaddress.ip_network(raw.strip("[]"), strict=False)
            return cls(entry, "network", network=str(net), port=port)
        except ValueError:
            pass
        kind = "exact"
        if raw.startswith("*."):
            kind, raw = "subdomains", raw[2:]
        elif raw.startswith("."):
            kind, raw = "domain", raw[1:]
        host = normalize_host(raw)
        quad = _whatwg_ipv4(host) if kind == "exact" else None
        if quad is not None:
            return cls(entry, "network", network=f"{quad}/32", port=port)
        return cls(entry, kind, host=host, port=port)

    def matches(self, host: str, port: int | None, ip: IPAddress | None) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.kind == "any":
            return True
        if self.kind == "network":
            if ip is None:
                return False
            net = _network(self.network)
            if ip.version != net.version and isinstance(ip, ipaddress.IPv6Address):
                mapped = ip.ipv4_mapped
                return mapped is not None and mapped in net
            return ip.version == net.version and ip in net
        if ip is not None:
            return False
        if self.kind == "exact":
            return host == self.host
        subdomain = host.endswith("." + self.host)
        return subdomain or (self.kind == "domain" and host == self.host)


@functools.lru_cache(maxsize=256)
def _network(text: str) -> IPNetwork:
    return ipaddress.ip_network(text)


@functools.lru_cache(maxsize=64)
def compile_patterns(entries: tuple[str, ...]) -> tuple[HostPattern, ...]:
    return tuple(HostPattern.parse(e) for e in entries if e.strip())


def _ip_of(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def check_egress(
    text_or_url: str,
    allow: Sequence[str] | None,
    deny: Sequence[str] | None,
    should_stop: Callable[[], bool] | None = None,
) -> list[Finding]:
    """Findings for each URL/host in the text that the deny list names
    (`egress.denied_domain`) or, with an allow list, that the allow list does not
    (`egress.not_allowed_domain`). With `should_stop` (see `find_urls`) the answer is
    incomplete once it said stop."""
    if allow is None and not deny:
        return []
    allowed = compile_patterns(tuple(allow)) if allow is not None else None
    denied = compile_patterns(tuple(deny or ()))
    out: list[Finding] = []
    for url in find_urls(text_or_url, should_stop):
        ip = _ip_of(url.host)
        if any(p.matches(url.host, url.port, ip) for p in denied):
            detector = "egress.denied_domain"
        elif allowed is not None and not any(p.matches(url.host, url.port, ip) for p in allowed):
            detector = "egress.not_allowed_domain"
        else:
            continue
        out.append(
            Finding(
                detector=detector, category="egress", start=url.start, end=url.end, value=url.url
            )
        )
    return out


class EgressDetector:
    """`check_egress` with fixed lists, as a `Detector` (unconfigured, it reports nothing)."""

    category: Category = "egress"

    def __init__(
        self,
        id: str = "egress.denied_domain",
        allow: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
    ) -> None:
        self._id = id
        self.allow = list(allow) if allow is not None else None
        self.deny = list(deny or ())

    @property
    def id(self) -> str:
        return self._id

    def scan(self, text: str) -> list[Finding]:
        return [f for f in check_egress(text, self.allow, self.deny) if f.detector == self._id]
