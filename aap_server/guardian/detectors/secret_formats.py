"""Secret detectors: provider token formats, credentials in URLs, private keys, and a
high-entropy fallback.

How a text is scanned (see `_views` for why): runs of 20+ token characters are found in one
C-speed pass; each run is split at `/`, `.` and `=` and every piece start is looked up by its
first two characters in an index of the known prefixes, so a format costs nothing unless its
prefix is there. Formats without a fixed prefix hang off a substring (`Q~`, `-us`,
`.atlasv1.`), a context (`AccountKey=`, `Bearer `, `aws_secret_access_key =`), `://` (URLs) or
`PRIVATE KEY` (key blocks).

Checksums are verified where the format publishes one: GitHub `gh*_` and npm `npm_` tokens
(CRC32 in the last six base62 characters), `age` keys (bech32), JWTs (the header must decode to
JSON with an `alg`), PyPI tokens (the macaroon must name pypi.org), OpenAI keys (the embedded
`T3BlbkFJ` marker). A token with the right prefix and a wrong checksum is not reported under
the provider's id; it may still be reported as `secret.entropy`.

The entropy fallback (`secret.entropy`) reports a piece of 20-200 characters from the
base64/base62 alphabet when all of these hold:

- it has an upper-case letter, a lower-case letter and at least two digits, and is not pure
  hex (hashes, git SHAs, ObjectIds, colours) — UUIDs and lower-case base32 fail the case test;
- its Shannon entropy is at least 0.8 * log2(min(length, 64)) bits per character (about the
  0.1st percentile of random base62/base64 strings of that length: 3.46 at 20 characters, 4.0
  at 32, 4.8 from 64 on);
- at most 45 % of it sits in same-case letter runs of 4 or more (random strings: median
  12-20 %; identifiers such as `HTTP2ServerConfigV3Builder`: 50-80 %);
- it is not a typed object id (`cus_…`, `msg_…`, `toolu_…`), a subresource-integrity hash
  (`sha384-…`), base64 of a known binary format (PNG, JPEG, GIF, PDF, ZIP, gzip) or of a data
  URI, one line of a line-wrapped base64 block, or base64 that decodes to readable text (that is
  an encoded message, which the injection detectors inspect).
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from typing import NamedTuple

from aap_server.guardian.detectors._spans import Backwards, StaticSpans
from aap_server.guardian.detectors._views import TextViews, distinct_runs
from aap_server.guardian.detectors.base import Finding
from aap_server.guardian.detectors.secret_catalog import (
    FORMATS,
    KEYWORD_IDS,
    KEYWORD_RULES,
    LITERAL_FORMATS,
    KeywordRule,
    SecretFormat,
)

__all__ = ["FORMATS", "OTHER_IDS", "SECRET_IDS", "SecretFormat", "scan_secrets_views"]


def _secret(detector: str, text: str, start: int, end: int) -> Finding:
    return Finding(
        detector=detector, category="secret", start=start, end=end, value=text[start:end]
    )


# Detected outside the token index (URLs, key blocks) or by context.
OTHER_IDS: dict[str, str] = {
    "secret.private_key": "PEM/OpenSSH/PGP private key block",
    "secret.database_url": "database URL with a password (postgres, mysql, mongodb, redis, ...)",
    "secret.url_password": "any other URL with a password in its userinfo",
    "secret.slack_webhook": "Slack incoming-webhook URL",
    "secret.discord_webhook": "Discord webhook URL",
    "secret.microsoft_teams_webhook": "Microsoft Teams incoming-webhook URL",
    "secret.aws_secret_key": "AWS secret access key (40 base64 characters after its name)",
    "secret.azure_storage_key": "Azure storage account key (AccountKey=...)",
    "secret.http_basic_auth": "HTTP Basic credentials (base64 user:password after `Basic`)",
    "secret.bearer_token": "opaque token after `Bearer`",
    "secret.assignment": "value of a key, token, secret or password named as such (assignments,"
    " headers, .npmrc/.pypirc lines, .netrc lines, XML elements, name/value pairs, curl -u)",
    "secret.entropy": "high-entropy fallback",
    **{id: d for id, d in KEYWORD_IDS.items() if id not in {f.id for f in FORMATS}},
}
SECRET_IDS: tuple[str, ...] = tuple(dict.fromkeys([*(f.id for f in FORMATS), *OTHER_IDS]))
for _f in LITERAL_FORMATS:
    if _f.id not in SECRET_IDS:
        SECRET_IDS += (_f.id,)
        OTHER_IDS[_f.id] = _f.description

_BY_HEAD: dict[str, list[SecretFormat]] = {}
for _f in FORMATS:
    for _head in _f.heads:
        if _f not in _BY_HEAD.setdefault(_head[:2], []):
            _BY_HEAD[_head[:2]].append(_f)
_ANCHORED = tuple(f for f in FORMATS if f.anchor)
_PREFIXED = frozenset(f.id for f in FORMATS)


def _match_formats(
    text: str, start: int, end: int, out: list[Finding], dropped: list[Finding]
) -> None:
    """Formats at the start of the token and after each `/`, `.` or `=` inside it."""
    token = text[start:end]
    if token.startswith("//"):
        segments = [token]  # a URL's host and path: its credentials are found by `_urls`
    elif "/" in token or "." in token or "=" in token:
        segments = token.replace(".", "/").replace("=", "/").split("/")
    else:
        segments = [token]
    pos = start
    for segment in segments:
        if segment[:2] in _BY_HEAD:
            _match_at(text, pos, out, dropped)
        pos += len(segment) + 1
    for fmt in _ANCHORED:
        if fmt.anchor in token:
            for m in fmt.pattern.finditer(text, start, end):
                out.append(_secret(fmt.id, text, m.start(), m.end()))


def _match_at(text: str, pos: int, out: list[Finding], dropped: list[Finding]) -> None:
    for fmt in _BY_HEAD[text[pos : pos + 2]]:
        if not text.startswith(fmt.heads, pos):
            continue
        m = fmt.pattern.match(text, pos)
        if m is None:
            continue
        if fmt.check is not None and not fmt.check(m):
            # A wrong checksum: a typo or a fake still reads as a credential; a body that
            # decodes to something else is not one (see the catalog's `on_fail`).
            if fmt.on_fail == "entropy":
                out.append(_secret("secret.entropy", text, m.start(), m.end()))
            elif fmt.on_fail == "drop":
                dropped.append(_secret(fmt.id, text, m.start(), m.end()))
            continue
        hit_start = pos
        if fmt.lead is not None:
            lead = fmt.lead.search(text, max(0, pos - 16), pos)
            if lead is None:
                continue
            hit_start = lead.start()
        out.append(_secret(fmt.id, text, hit_start, m.end()))


# --- context formats and the entropy fallback ---------------------------------------------

_AWS_SECRET_CONTEXT = re.compile(
    r"(?i)(?:aws.{0,24}secret|secret.?access.?key)[\"']?\s*[:=>]{1,2}\s*[\"']?\Z"
)
_BASIC_BEFORE = re.compile(r"(?i)\bbasic\s+\Z")
_BEARER_BEFORE = re.compile(r"(?i)\bbearer\s+\Z")
_HEX = re.compile(r"[0-9a-fA-F]+")
_B64_BODY = re.compile(r"[A-Za-z0-9+/_-]+")
_DIGIT = re.compile(r"\d")
_CASE_RUNS = re.compile(r"[a-z]{4,}|[A-Z]{4,}")
_OBJECT_ID = re.compile(
    r"(?:acct|asst|ba|batch|call|card|ch|chatcmpl|conv|cs|cus|evt|fc|file|ft|ftjob|ii|in|item"
    r"|li|msg|msgbatch|org|pi|pl|pm|po|price|prod|proj|py|re|req|resp|run|seti|si|src"
    r"|srvtoolu|step|sub|thread|toolu|txn|user|vs)_[A-Za-z0-9]{8,40}\Z"
)
_SRI = re.compile(r"sha(?:1|256|384|512)-")
# What names a checksum right before its value: `h1:` (go.sum), `sha256:`/`sha512-` (npm,
# pip, OCI), `--hash=`, `integrity`, `checksum`, `digest`, `etag`.
_CHECKSUM_LABEL = re.compile(
    r"(?:\bh1:|\bsha(?:1|224|256|384|512)?[:=-]|\bmd5[:=-]|\bblake2b?[:=-]|hash[\"']?\s*[:=]\s*"
    r"[\"']?(?:sha\w*[:=-])?|integrity[\"']?\s*[:=]\s*[\"']?|checksum[\"']?\s*[:=]\s*[\"']?"
    r"|digest[\"']?\s*[:=]\s*[\"']?|etag[\"']?\s*[:=]\s*[\"']?)\Z"
)
_BINARY_MAGIC = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "JVBERi0", "UEsDB", "H4sI", "Qk")
_TEXTY = bytes(range(0x20, 0x7F)) + b"\t\n\r"


def shannon_entropy(value: str) -> float:
    """Bits per character of `value`'s character distribution."""
    n = len(value)
    return math.log2(n) - sum(c * math.log2(c) for c in Counter(value).values()) / n


def entropy_threshold(length: int) -> float:
    return 0.8 * math.log2(min(length, 64))


def decode_base64(value: str) -> bytes | None:
    """Standard or URL-safe base64, padding optional; None if it is not base64."""
    body = value.rstrip("=")
    if len(body) % 4 == 1 or not _B64_BODY.fullmatch(body):
        return None
    body += "=" * (-len(body) % 4)
    try:
        if "-" in body or "_" in body:
            return base64.urlsafe_b64decode(body)
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None


def is_text(data: bytes) -> bool:
    """Mostly printable ASCII: what encoded messages (not keys) decode to."""
    return len(data) >= 8 and len(data.translate(None, _TEXTY)) <= 0.05 * len(data)


def looks_random(piece: str) -> bool:
    """The entropy test itself (see the module docstring)."""
    n = len(piece)
    if not 20 <= n <= 200 or piece.islower() or piece.isupper() or piece.isalpha():
        return False
    if len(_DIGIT.findall(piece)) < 2 or _HEX.fullmatch(piece):
        return False
    if sum(len(run) for run in _CASE_RUNS.findall(piece)) > 0.45 * n:
        return False
    return shannon_entropy(piece) >= entropy_threshold(n)


def _context_or_entropy(v: TextViews, start: int, end: int, out: list[Finding]) -> None:
    """The context formats and the entropy fallback for one piece of a token."""
    text = v.text
    while end > start and text[end - 1] in "/+-_~":
        end -= 1
    n = end - start
    if n < 20:
        return
    piece = text[start:end]
    padded = end
    while padded < len(text) and text[padded] == "=" and padded - end < 2:
        padded += 1
    # Context formats first: the name of a secret says what it is.
    if n >= 80 and text.startswith("AccountKey=", start - 11):
        out.append(_secret("secret.azure_storage_key", text, start, padded))
        return
    if n == 40:
        before = text[max(0, start - 48) : start]
        if "ecret" in before.lower() and _AWS_SECRET_CONTEXT.search(before):
            out.append(_secret("secret.aws_secret_key", text, start, end))
            return
    if start > 0 and text[start - 1] in " \t":
        lead = text[max(0, start - 10) : start].rstrip().lower()
        if lead.endswith("basic") and _BASIC_BEFORE.search(text, max(0, start - 10), start):
            decoded = decode_base64(text[start:padded])
            if decoded and is_text(decoded) and b":" in decoded.strip(b":"):
                out.append(_secret("secret.http_basic_auth", text, start, padded))
                return
        if (
            lead.endswith("bearer")
            and _BEARER_BEFORE.search(text, max(0, start - 10), start)
            and _DIGIT.search(piece)
            and not piece.isupper()
            and shannon_entropy(piece) >= 3.0
        ):
            out.append(_secret("secret.bearer_token", text, start, padded))
            return
    if n > 200 or piece.islower() or piece.isupper() or piece.isalpha() or piece.isdigit():
        return
    if looks_random(piece) and not _excluded_random(v, piece, start, end):
        out.append(_secret("secret.entropy", text, start, end))


def _excluded_random(v: TextViews, piece: str, start: int, end: int) -> bool:
    """Random-looking strings that are not secrets (see the module docstring)."""
    text = v.text
    if _OBJECT_ID.match(piece) or _SRI.match(piece) or piece.startswith(_BINARY_MAGIC):
        return True
    if text.startswith("base64,", start - 7):
        return True
    if _CHECKSUM_LABEL.search(text[max(0, start - 24) : start].lower()):
        return True  # a module, package or content hash (go.sum `h1:`, `--hash=sha256:` ...)
    # One line of a line-wrapped base64 block (PEM certificates, MIME bodies).
    if end < len(text) and text[end] == "\n" and end + 1 in v.token_starts:
        return True
    if start > 0 and text[start - 1] == "\n" and start - 1 in v.token_ends:
        return True
    decoded = decode_base64(piece)
    return decoded is not None and is_text(decoded)


# --- URLs with credentials, webhooks, private key blocks ----------------------------------

_SCHEME_TAIL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}\Z")
_USERINFO = re.compile(r"([^\s/?#@:\"'<>]*):([^\s/?#\"'<>]*)@([^\s/?#@:\"'<>]+)")
_URL_REST = re.compile(r"[^\s\"'<>`]*")
_SLACK_WEBHOOK = re.compile(
    r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/+-]{20,}"
)
_DISCORD_WEBHOOK = re.compile(
    r"(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api/webhooks/\d{15,21}/[A-Za-z0-9_-]{50,}"
)
_TEAMS_WEBHOOK = re.compile(
    r"[A-Za-z0-9-]{1,63}\.webhook\.office\.com/webhookb2/[A-Za-z0-9-]{36}@[A-Za-z0-9-]{36}"
    r"/IncomingWebhook/[A-Za-z0-9]{32}/[A-Za-z0-9-]{36}(?:/[A-Za-z0-9_-]{20,})?"
)


def _hook_id(text: str, host: int) -> str:
    if text.startswith("hooks.", host):
        return "secret.slack_webhook"
    if text.startswith(("discord", "ptb.discord", "canary.discord"), host):
        return "secret.discord_webhook"
    return "secret.microsoft_teams_webhook"


def _bare_slack_hooks(text: str, out: list[Finding]) -> None:
    """`hooks.slack.com/services/…` written without a scheme (the URL scan needs `://`)."""
    pos = text.find("hooks.slack.com/")
    while pos != -1:
        if not text.startswith("://", pos - 3):
            hook = _SLACK_WEBHOOK.match(text, pos)
            if hook is not None:
                out.append(_secret("secret.slack_webhook", text, pos, hook.end()))
        pos = text.find("hooks.slack.com/", pos + 16)


_DB_SCHEMES_WORDS = (
    "postgres postgresql mysql mariadb mongodb redis rediss amqp amqps mssql sqlserver "
    "oracle cockroachdb clickhouse couchdb cassandra neo4j bolt memcached db2 snowflake"
)

_DB_SCHEMES = frozenset(_DB_SCHEMES_WORDS.split())
_PLACEHOLDER_PASSWORD = re.compile(
    r"(?i)\*+|x+|\.+|\?+|<[^>]*>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\{\{.*\}\}|%\(?\w*\)?s?|\[.*\]"
    r"|\$\w+|password|passwd|pass|pwd|secret|your[_-]?password|changeme|redacted|hidden"
)
_TRAILING_PUNCT = ".,;:!?)]}'\""
_HOOK_HOSTS = (
    "hooks.slack.com/",
    "discord.com/",
    "discordapp.com/",
    "ptb.discord",
    "canary.discord",
)
_AUTHORITY_BREAK = re.compile(r"[\s/?#\"'<>]")
_MAX_URL_REST = 2048


def _urls(text: str, out: list[Finding]) -> None:
    pos = text.find("://")
    while pos != -1:
        after = pos + 3
        following = text.find("://", after)
        bound = min(after + _MAX_URL_REST, following if following != -1 else len(text))
        hook = None
        if text.startswith(_HOOK_HOSTS, after):
            hook = _SLACK_WEBHOOK.match(text, after) or _DISCORD_WEBHOOK.match(text, after)
        elif ".webhook.office.com/" in text[after : after + 80]:
            hook = _TEAMS_WEBHOOK.match(text, after)
        cred = None
        if hook is None:
            at = text.find("@", after, after + 512)
            if at != -1 and not _AUTHORITY_BREAK.search(text, after, at):
                cred = _USERINFO.match(text, after)
        if hook is not None or cred is not None:
            scheme = _SCHEME_TAIL.search(text, max(0, pos - 31), pos)
            start = scheme.start() if scheme else pos
            if hook is not None:
                out.append(_secret(_hook_id(text, after), text, start, hook.end()))
            elif (
                cred is not None
                and scheme is not None
                and cred.group(2)
                and not _PLACEHOLDER_PASSWORD.fullmatch(cred.group(2))
            ):
                # The path and query, up to a bound: a run without spaces must not be read
                # to its end at every URL in it (the credentials are before it anyway).
                rest = _URL_REST.match(text, cred.end(), max(cred.end(), bound))
                end = rest.end() if rest else cred.end()
                while end > cred.end() and text[end - 1] in _TRAILING_PUNCT:
                    end -= 1
                base = scheme.group().lower().split("+", 1)[0]
                kind = "database_url" if base in _DB_SCHEMES else "url_password"
                out.append(_secret(f"secret.{kind}", text, start, end))
        pos = following


_KEY_BEGIN = re.compile(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_BODY = re.compile(r"(?:[A-Za-z0-9+/=:,\-\s]|\\n)*")
# The longest key block looked for (an 8192-bit RSA key in PEM is about 6.5 KB).
_MAX_KEY_BLOCK = 20_000
_MIN_KEY_BODY = 64


def _private_keys(text: str, out: list[Finding]) -> None:
    """Key blocks from `BEGIN` to their `END`, or, unterminated, to the end of the body.
    Each block is looked for only up to the next `BEGIN` (and at most `_MAX_KEY_BLOCK`), so
    every character is read a bounded number of times however many `BEGIN` lines there are."""
    begins = list(_KEY_BEGIN.finditer(text))
    ends = [m.span() for m in _KEY_END.finditer(text)]
    ends_at = [start for start, _ in ends]
    for index, begin in enumerate(begins):
        limit = begin.end() + _MAX_KEY_BLOCK
        if index + 1 < len(begins):
            limit = min(limit, begins[index + 1].start())
        limit = min(limit, len(text))
        i = bisect_left(ends_at, begin.end())
        if i < len(ends) and ends[i][1] <= limit:
            body_end, end = ends[i]
        else:
            body = _KEY_BODY.match(text, begin.end(), limit)
            end = (
                begin.end() + len(text[begin.end() : body.end()].rstrip()) if body else begin.end()
            )
            body_end = end
        # The smallest real key (an Ed25519 key in PEM) has 64 base64 characters; a shorter
        # body is documentation (`-----BEGIN PRIVATE KEY-----\n...\n-----END …`).
        if len("".join(text[begin.end() : body_end].split())) >= _MIN_KEY_BODY:
            out.append(_secret("secret.private_key", text, begin.start(), end))


# --- placeholders and keyword-anchored secrets ---------------------------------------------

_ASCENDING = "abcdefghijklmnopqrstuvwxyz"
# Every run of 6 (and of 8) consecutive letters or digits, looked for with `in` (C speed).
_RUNS = {
    n: tuple(seq[i : i + n] for seq in (_ASCENDING, "0123456789") for i in range(len(seq) - n + 1))
    for n in (6, 8)
}
_PLACEHOLDER_WORDS = ("example", "xxxx", "placeholder", "your", "here", "dummy", "sample",
                      "redacted", "changeme", "0000", "1234567", "****", "<", "{",
                      "...")  # fmt: skip


def is_placeholder(value: str, run_limit: int = 6) -> bool:
    """A documentation value, not a credential: few distinct characters, a placeholder word,
    or a run of `run_limit` consecutive letters or digits (`abcdef`, `klmnop`, `123456`), which
    a random token of any length practically never has. A token with its provider's prefix is
    stronger evidence: for those the run must be 8 long (`12345678`) to count."""
    lower = value.lower()
    body = lower.rstrip("=")
    # (Capped: a long hex or base64 token has at most 16 or 64 distinct characters.)
    if len(set(body)) <= max(3, min(len(body) // 8, 8)):
        return True
    if lower.startswith("$") or any(word in lower for word in _PLACEHOLDER_WORDS):
        return True  # (`$NAME` is a reference; a `$` inside is a separator: Braintree)
    return any(run in body for run in _RUNS[run_limit])


# --- assignments: a value under a name that says what it is -------------------------------
#
# Found operator first: `=`, `:`, `:=`, `=>` followed by a value of 8+ value characters is
# found at C speed (the pattern starts with a literal class), and only there is the name to
# the left read (a bounded look-back). The name decides: a provider's name (`asanaToken`,
# `SUMO_ACCESS_KEY`) with a value of that provider's structure is `secret.<provider>`; a
# credential word (`api_key`, `X-Auth-Token`, `password`, `_authToken`) with a value that is
# not a word, a reference or a placeholder is `secret.assignment`.

_VALUE_CHARS = r"A-Za-z0-9+/=_.~!@#$%^&*:|?-"
# (A quote may be escaped: JSON text inside a JSON string, `{\\"api_key\\":\\"…\\"}`.)
_ASSIGN_OP = re.compile(
    r"[:=][=>]?[ \t]{0,6}(?:\\{0,7}[\"'`])?(?=["
    + _VALUE_CHARS
    + r"]{8}|(?i:bearer|token|basic|digest) )"
)
_VALUE = re.compile(r"[" + _VALUE_CHARS + r"]{5,301}")
_NAME_WINDOW = 96
# The name, read backwards from the operator: its last identifier, and one word before it
# (`facebook access_token`, `String ETSYToken`), past closing quotes and brackets.
_REVERSED_NAME = re.compile(r"[\"'\]\\]{0,10}[ \t]{0,6}([\w.-]{1,60})(?:[ \t]{1,4}([\w.-]{1,30}))?")
_NAME_BEFORE_EQUALS = re.compile(r"[A-Za-z_][\w.-]{0,59}")
_NAME_PARTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_CREDENTIAL_WORDS = (
    "key keys token tokens secret secrets password passwords passwd pwd pass passphrase auth"
    " credential credentials creds apikey apitoken authtoken accesstoken accesskey secretkey"
    " privatekey clientsecret authorization"
)
_CREDENTIAL_PARTS = frozenset(_CREDENTIAL_WORDS.split())
# Parts that turn a credential word into something else: `token_count`, `key_id`,
# `nextPageToken`, `public_key`, `sort_key`, `password_min_length`.
_NOT_AFTER_WORDS = (
    "id ids name names type types count length len size file files path dir url uri endpoint"
    " expiry expires expiration expire ttl prefix format field fields header param params env"
    " var label ref version index idx limit max min mode policy rotation time timeout hint"
    " provider source store storage location region alias algorithm algo hash digest usage"
    " enabled required prompt placeholder pattern regex"
)
_NOT_AFTER = frozenset(_NOT_AFTER_WORDS.split())
_NOT_BEFORE_WORDS = (
    "public pub page next prev previous cursor continuation pagination sync csrf xsrf primary"
    " foreign sort partition cache idempotency hash range unique composite row lookup dedup"
    " dedupe map dict object registry event message translation i18n hot short"
)
_NOT_BEFORE = frozenset(_NOT_BEFORE_WORDS.split())
# Values that are code, not data: a word or constant (`ACCESS_TOKEN`), a snake_case,
# camelCase or PascalCase name (`imdsv2_session_token`, `PKCS12PrivateKeyTypes`), a dotted
# path (`os.environ.get`), or a `:`/`/`-list of such (`KEY:USER_ID:ORG_ID`, `PEM/OpenSSH`).
# A password is chosen by a person and may read like a name (`Summer2024`): under a password's
# name only words, constants and dotted paths count as code.
_CODE_WORD = re.compile(
    r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Za-z_.-]+|[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+"
)
# Each part of a name has one way to match (digits end the word before them; a capital run
# ends where a capitalised word starts), so the match is linear: no split is ever retried.
_CODE_NAME = re.compile(
    r"_*[a-z]+[0-9]*(?:_[a-z]+[0-9]*)+"
    r"|(?:[a-z]{2,}[0-9]*|[A-Z][a-z]+[0-9]*|[A-Z]{2,}[0-9]*(?=[A-Z][a-z]))"
    r"(?:[A-Z][a-z]+[0-9]*|[A-Z]{2,}[0-9]*(?=[A-Z][a-z]|$))+|[A-Z][A-Z0-9]{0,9}"
)
_CODE_SEPARATORS = re.compile(r"[:/]")
_PASSWORD_PARTS = frozenset(("password", "passwords", "passwd", "pwd", "pass", "passphrase"))


def _is_code(value: str, password: bool = False) -> bool:
    parts = [p for p in _CODE_SEPARATORS.split(value) if p]
    return bool(parts) and all(
        (_CODE_WORD.fullmatch(p) or (not password and _CODE_NAME.fullmatch(p)))
        and not any(looks_random(q) for q in p.split("."))
        for p in parts
    )


_AUTH_SCHEMES = frozenset(("bearer", "token", "basic", "apikey", "api-key", "digest"))
# Provider keywords by their first three letters, separators dropped (`message_bird` is
# `messagebird`): a name's parts are looked up, never the text searched for 100 words.
_KEYWORDS: dict[str, list[tuple[str, KeywordRule]]] = {}
for _rule in KEYWORD_RULES:
    for _word in _rule.keywords:
        _plain = _word.replace("_", "").replace("-", "")
        _KEYWORDS.setdefault(_plain[:3], []).append((_plain, _rule))


def _name_parts(name: str) -> list[str]:
    """`asanaToken` -> [asana, token]; `BUNDLE_GEMS__CONTRIBSYS__COM` -> [bundle, gems, ...];
    `ETSYToken` -> [etsy, token]. A keyword inside a word (`rookTable`) is no part."""
    return [p.lower() for p in _NAME_PARTS.findall(name)]


def _named_rules(parts: list[str]) -> list[KeywordRule]:
    """The rules of the providers the parts name (a part that starts with its keyword, or two
    or three parts that spell it), in the order they are tried."""
    named_rules: list[KeywordRule] = []
    for i, part in enumerate(parts):
        spelled = part
        for j in range(i, min(i + 3, len(parts))):
            if j > i:
                spelled += parts[j]
            for keyword, rule in _KEYWORDS.get(spelled[:3], ()):
                if spelled == keyword or (j == i and part.startswith(keyword)):
                    named_rules.append(rule)
    return named_rules


class _Name(NamedTuple):
    """What an assignment's name (and the word before it) says, whatever the value."""

    rules: tuple[KeywordRule, ...]  # providers named, by the name first, then the word before
    strength: str  # see `_credential_name`
    password: bool
    after_other: bool  # the word before says it is something else (`Next page token: …`)
    # Other formats: `value` of a name/value pair (`key="ApiKey" value="…"`); a command's
    # user flag before the name (`-u bob:…`) or as the name (`--user=bob:…`).
    value_of_pair: bool = False
    user_flag: str = ""  # "", "before" or "name"


# Names repeat (every row of a JSON array names the same keys): each is read once, the
# newest this many kept.
_NAMES_KEPT = 4096


@functools.lru_cache(maxsize=_NAMES_KEPT)
def _name_facts(reversed_name: str, reversed_before: str | None) -> _Name:
    """`_Name` of the identifier right before an operator and the word before that, as
    `_REVERSED_NAME` read them (reversed)."""
    name, before = reversed_name[::-1], (reversed_before or "")[::-1]
    parts = _name_parts(name)
    rules = _named_rules(parts) + (_named_rules(_name_parts(before)) if before else [])
    after_other = bool(before) and before.rsplit("_", 1)[-1].lower() in _NOT_BEFORE
    user_flag = "before" if before in _USER_FLAGS else "name" if name in _USER_FLAGS else ""
    return _Name(
        tuple(rules),
        *_credential_name(name, parts),
        after_other,
        name.lower() == "value",
        user_flag,
    )


# `curl -u user:password`, `--user user:password`, httpie's `--auth user:password`.
_USER_FLAGS = frozenset(("-u", "--user", "--auth"))
# The same quoted (`-u 'user:password'`), read backwards from the opening quote: a user flag
# (a word of its own) and the spaces after it.
_REVERSED_USER_FLAG = re.compile(r"[ \t]{1,4}(?:u-|resu--|htua--)(?![\w-])")


def _after_quoted_user_flag(text: str, name_start: int, backwards: Backwards) -> bool:
    """Whether the name at `name_start` opens a quoted `user:password` after a user flag."""
    quote = name_start - 1
    if quote < 1 or text[quote] not in "'\"":
        return False
    return backwards.match(_REVERSED_USER_FLAG, quote, 16) is not None


def _credential_name(name: str, parts: list[str]) -> tuple[str, bool]:
    """(`""` if `name` does not name a credential; `"part"` if a credential word is a part of
    it after a separator or at its start; `"camel"` if only camelCase sets it apart (weaker:
    `nonMatchingToken` in a test is not always a credential), whether it names a password)."""
    for i, part in enumerate(parts):
        if part not in _CREDENTIAL_PARTS:
            continue
        if any(p in _NOT_AFTER for p in parts[i + 1 :]) or any(p in _NOT_BEFORE for p in parts[:i]):
            return "", False
        separated = "_" in name or "-" in name or "." in name or len(parts) == 1
        password = any(p in _PASSWORD_PARTS for p in parts)
        return ("part" if separated or name.isupper() else "camel"), password
    for i, part in enumerate(parts):
        # A credential word glued to what it is for (`PGPASSWORD`, `npmtoken`): weaker, as
        # `camelCase`; not after a word that makes it something else (`csrftoken`).
        word = _GLUED_WORD.search(part)
        if word is None or any(part[: word.start()].endswith(w) for w in _NOT_BEFORE):
            continue
        if any(p in _NOT_AFTER for p in parts[i + 1 :]):
            return "", False
        return "camel", word.group().startswith("pass")
    return "", False


# Credential words that end a word they are glued to (not `key` or `pass`: `monkey`, `bypass`).
_GLUED_WORD = re.compile(r"(?<=[a-z])(?:password|passwd|passphrase|secret|token)s?\Z")


# After this many `:` and `=` found one by one, the rest are searched for (JSON is full of
# them, and there the search is faster).
_FEW_OPERATORS = 64


def _operators(text: str) -> Iterator[re.Match[str]]:
    """`_ASSIGN_OP.finditer(text)`, tried only at the `:` and `=` found by `str.find` (C speed;
    a search for a pattern that starts with a class tests every character in turn, several
    times slower on text with few operators) while there are few."""
    next_at = {ch: text.find(ch) for ch in ":="}
    searched_to = 0  # as `finditer`: the next match starts at or after the last one's end
    for _ in range(_FEW_OPERATORS):
        found = [at for at in next_at.values() if at != -1]
        if not found:
            return
        at = min(found)
        ch = text[at]
        next_at[ch] = text.find(ch, at + 1)
        if at < searched_to:
            continue
        op = _ASSIGN_OP.match(text, at)
        if op is not None:
            searched_to = op.end()
            yield op
    rest = [at for at in next_at.values() if at != -1]
    if rest:
        yield from _ASSIGN_OP.finditer(text, max(searched_to, min(rest)))


def _name_anchors() -> tuple[bytes, ...]:
    """Every credential part and provider keyword a name can hold, less those holding a
    shorter one (`apikey` holds `key`)."""
    words = _CREDENTIAL_PARTS | {k for rules in _KEYWORDS.values() for k, _ in rules}
    kept = [w for w in words if not any(o != w and o in w for o in words)]
    return tuple(sorted(w.encode() for w in kept))


def _one_search(words: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """A search for any of `words`, its alternatives grouped by first letter (one pass)."""
    by_first: dict[bytes, list[bytes]] = {}
    for word in words:
        by_first.setdefault(word[:1], []).append(word[1:])
    return re.compile(
        b"|".join(
            re.escape(first)
            + b"(?:"
            + b"|".join(re.escape(alt) for alt in sorted(rest, key=len, reverse=True))
            + b")"
            for first, rest in sorted(by_first.items())
        )
    )


_NAME_ANCHORS = _name_anchors()
_ANY_NAME_ANCHOR = _one_search(_NAME_ANCHORS)
_NOT_NAME_LETTERS = bytes(b for b in range(128) if not chr(b).isalnum())
_LOWER_DIGITS_TO_SPACE = bytes.maketrans(
    b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", b" " * 10 + b"abcdefghijklmnopqrstuvwxyz"
)
assert all(anchor.isalpha() for anchor in _NAME_ANCHORS)
# With more operators than this, a text whose names cannot hold an anchor is not read at all.
_ANCHOR_GATE_FROM = 16


def _may_name_a_credential(text: str) -> bool:
    """False when no name in the text can name a credential or a provider: a name's parts
    (`_name_parts`) are its ASCII letters and digits, so every part, and every run of
    adjacent parts a keyword is spelled from, is in the text's ASCII letters and digits
    run together (lower-cased); if no anchor is there, no name has one."""
    # Anchors are letters only, so each lies inside a run of letters of that squeezed text:
    # the distinct runs (JSON rows repeat their names; ids and numbers split them) are
    # searched, a fraction of the text (the search tries every position: ~30 ns a character).
    # One `translate` squeezes, lower-cases and turns digits into spaces.
    names = distinct_runs(text.encode("ascii", "ignore"), _LOWER_DIGITS_TO_SPACE, _NOT_NAME_LETTERS)
    return _ANY_NAME_ANCHOR.search(b" ".join(names)) is not None


def _assignments(text: str, out: list[Finding]) -> None:
    if "=" not in text and ":" not in text:
        return
    if text.count(":") + text.count("=") > _ANCHOR_GATE_FROM and not _may_name_a_credential(text):
        return  # JSON rows of `"id": …`, `"total": …`: no name to read
    backwards = Backwards(text)
    length = len(text)
    reach = 0
    for op in _operators(text):
        start = op.end()
        if start < reach:
            continue  # inside the previous value (`a=b=c`, `x:y:z`)
        value_match = _VALUE.match(text, start)
        if value_match is None:
            continue
        end = value_match.end()
        operator = op.group()
        reach = end
        if operator[0] == ":":
            equals = text.find("=", start, end)
            if equals != -1 and text[equals:end].strip("=") and equals > start:
                if operator == ":" or operator.endswith((": ", ":\t")):
                    # `//registry.npmjs.org/:_authToken=…`: after a colon, `name=value` is an
                    # assignment of its own; read it from its `=`.
                    end = reach = equals
                elif _NAME_BEFORE_EQUALS.fullmatch(text, start, equals):
                    # A quoted value that is an assignment (`"content": "DB_PASSWORD=…"`, an
                    # .env line in JSON): the whole value is judged under the outer name, and
                    # the `name=value` inside it on its own too.
                    reach = equals
        if end - start > 300 or text.find("://", start, min(end, start + 16)) != -1:
            continue  # a blob or an URL, not a value: the token and URL detectors judge them
        name = backwards.match(_REVERSED_NAME, op.start(), _NAME_WINDOW)
        if name is None:
            continue
        raw = text[start:end]
        if ".." in raw:
            continue  # elided (`ops_eyJzaW..[Redacted]`, `sk-abc...`): not a usable value
        value = raw.rstrip(".,:;!?")
        if end < length and text[end] == " " and value.lower() in _AUTH_SCHEMES:
            # `Authorization: Bearer <token>`: the value is the word after the scheme.
            following = _VALUE.match(text, end + 1)
            if following is None:
                continue
            start, end = following.span()
            reach = end
            value = text[start:end].rstrip(".,:;!?")
        elif len(value) < 8:
            continue
        facts = _name_facts(name.group(1), name.group(2))
        if facts.value_of_pair:
            # `key="ApiKey" value="…"`, `{"name": "DB_PASSWORD", "value": "…"}`: the name
            # is the pair's other half, read backwards from `value`.
            pair = backwards.match(_REVERSED_KEY_NAME, length - name.end(1), 200)
            if pair is not None:
                facts = _name_facts(pair.group(1), None)
        elif facts.user_flag == "before" and operator[0] == ":":
            facts = _PASSWORD_NAME  # `-u bob:<password>`
        elif (
            operator[0] == ":"
            and name.group(2) is None
            and _after_quoted_user_flag(text, length - name.end(1), backwards)
        ):
            facts = _PASSWORD_NAME  # `-u 'bob:<password>'`, `--user "bob:<password>"`
        elif facts.user_flag == "name" and operator[0] == "=" and ":" in value:
            colon = value.index(":") + 1  # `--user=bob:<password>`
            start, value, facts = start + colon, value[colon:], _PASSWORD_NAME
        _judge(text, start, value, facts, out)


def _judge(text: str, start: int, value: str, facts: _Name, out: list[Finding]) -> None:
    """Report `value` (at `start`) if its name says it is a credential and it reads as one."""
    if not (facts.rules or facts.strength):
        return  # the name is no credential's and no provider's (`id`, `created_at`)
    end = start + len(value)
    rule = next((rule for rule in facts.rules if rule.value.fullmatch(value)), None)
    if rule is not None:
        if not is_placeholder(value):
            out.append(_secret(rule.id, text, start, end))
        return
    if (end < len(text) and text[end] in "([") or "://" in value:
        return  # a call, an index or a URL: code or an address, not a credential
    if facts.after_other:
        return  # `Next page token: …`
    if facts.strength and _secret_like(value, facts.strength == "camel", facts.password):
        out.append(_secret("secret.assignment", text, start, end))


# --- credentials in other config formats -----------------------------------------------------
#
# Each found from a literal (C speed) and read in a bounded window around it.

# `.netrc`: `machine <host> login <user> password <value>` (tokens split by any white space).
# (Read backwards from `password`: `machine <host>`, `login <user>`, `account <a>`, `default`.)
_NETRC_BEFORE = re.compile(r"\s{1,40}(?:\S{1,253}\s{1,40}(?:enihcam|nigol|tnuocca)|tluafed)\b")
_NETRC_VALUE = re.compile(r"password[ \t]+(\S{8,300})")
# An XML element named as a credential: `<password>…</password>`, `<ns:apiKey>…</ns:apiKey>`.
_XML_ELEMENT = re.compile(r"<([A-Za-z_][\w.:-]{0,59})>([^<>\s]{8,300}+)</\1>")
# A name/value pair: `<add key="ApiKey" value="…"/>`, `{"name": "DB_PASSWORD", "value": "…"}`,
# a Kubernetes `- name: X` / `value: …`: read backwards from `value` (`_assignments`).
_REVERSED_KEY_NAME = re.compile(
    r"[\"']?\s{0,40}(?:,\s{0,40})?[\"']?([\w.-]{1,60})[\"']?[ \t]{0,6}[:=][ \t]{0,6}[\"']?"
    r"(?:yek|eman)\b"
)

_PASSWORD_NAME = _name_facts("drowssap", None)  # what `password` says


def _other_formats(v: TextViews, out: list[Finding]) -> None:
    """`.netrc` lines and XML elements (name/value pairs and command flags are read by
    `_assignments`, at their operator)."""
    text = v.text
    # `password` stands as a word of its own in a `.netrc` line: a look-up in the text's words
    # when the injection detectors have listed them, not a pass over the text.
    if v.may_hold_word("password"):
        backwards = Backwards(text)
        for m in _NETRC_VALUE.finditer(text):
            if backwards.match(_NETRC_BEFORE, m.start(), 340):
                _judge(text, m.start(1), m.group(1), _PASSWORD_NAME, out)
    if "<" in text and "</" in text:  # (a `memchr` first: prose seldom has `<`)
        for m in _XML_ELEMENT.finditer(text):
            name = m.group(1).rsplit(":", 1)[-1]
            if name.lower() not in ("key", "keys"):  # a plist's `<key>` names the next value
                _judge(text, m.start(2), m.group(2), _name_facts(name[::-1], None), out)


def _secret_like(value: str, strict: bool = False, password: bool = False) -> bool:
    """A value worth hiding: not a word or an identifier (`ACCESS_TOKEN`, `my-app`), not a
    number, a boolean, a path, a reference or a placeholder; mixes kinds of characters with
    some entropy. `strict` (a camelCase name) also asks for 20+ characters or both cases."""
    if len(value) < 8 or value.isdigit() or _is_code(value, password):
        return False
    if value.lower() in ("true", "false", "null", "none", "undefined"):
        return False
    if value.startswith(("/", "./", "~/", "#", "process.env", "os.environ", "env.", "$")):
        return False
    if is_placeholder(value):
        return False
    kinds = sum((any(c.isdigit() for c in value), any(c.isalpha() for c in value),
                 any(not c.isalnum() for c in value)))  # fmt: skip
    if kinds < 2 or shannon_entropy(value) < 2.5:
        return False
    if strict:
        return len(value) >= 20 or (not value.islower() and not value.isupper())
    return True


# Each literal format with a character of its anchor that prose seldom has (its last
# non-alphanumeric one, else its last).
_LITERAL_GATES = tuple(
    (fmt, next((ch for ch in reversed(fmt.anchor) if not ch.isalnum()), fmt.anchor[-1]))
    for fmt in LITERAL_FORMATS
)
_FB_APP_TOKEN = re.compile(r"(?<![0-9])[0-9]{15,16}[|%][A-Za-z0-9_-]{27,40}(?![A-Za-z0-9_-])")


def scan_secrets_views(v: TextViews) -> list[Finding]:
    """Every secret hit in the text (overlaps are resolved by the caller)."""
    text = v.text
    out: list[Finding] = []
    # A longer literal is looked for only where rare characters of it are (`in` with one
    # character is a `memchr`, several times faster than a substring search).
    if ":" in text and "/" in text and "://" in text:
        _urls(text, out)
    if "/" in text and "hooks.slack.com/" in text:
        _bare_slack_hooks(text, out)
    if "-" in text and "V" in text and "PRIVATE KEY" in text:
        _private_keys(text, out)
    blocks = StaticSpans((f.start, f.end) for f in out)
    skipped: set[int] = set()
    dropped: list[Finding] = []
    for index, (start, end) in enumerate(v.tokens):
        if blocks and blocks.overlaps(start, end):
            skipped.add(index)  # inside a URL or key block already reported
        else:
            _match_formats(text, start, end, out, dropped)
    for fmt, rare in _LITERAL_GATES:
        if rare in text and fmt.anchor in text:
            out.extend(_secret(fmt.id, text, *m.span()) for m in fmt.pattern.finditer(text))
    if "acebook" in v.lower:  # (one search, where the text's two cases took two)
        out.extend(
            _secret("secret.facebook_secret", text, m.start(), m.end())
            for m in _FB_APP_TOKEN.finditer(text)
        )
    spans = StaticSpans([*((f.start, f.end) for f in out), *((f.start, f.end) for f in dropped)])
    tokens = v.tokens
    for start, end, index in v.pieces:
        if index in skipped or (spans and spans.overlaps(start, end)):
            continue
        token_start, token_end = tokens[index]
        if text.startswith("//", token_start):
            continue  # a URL's host and path: ids in paths are not secrets (queries are apart)
        if text.startswith("...", token_start) or text.endswith("...", token_start, token_end):
            continue  # an excerpt (`…6wqX6f…`) is not a usable credential
        _context_or_entropy(v, start, end, out)
    _assignments(text, out)  # last: overlaps with the above are resolved by rank
    _other_formats(v, out)
    return [
        f
        for f in out
        if f.detector in _WHOLE_BLOCKS
        or not is_placeholder(_placeholder_body(f), 8 if f.detector in _PREFIXED else 6)
    ]


def _placeholder_body(finding: Finding) -> str:
    # A Twitter bearer token opens with 22 `A`s by construction; judge what follows.
    if finding.detector == "secret.twitter_token" and finding.value.startswith("A" * 22):
        return finding.value[22:]
    return finding.value


# Findings that span more than a token (a URL, a key block): judged by their own rules.
_WHOLE_BLOCKS = frozenset(
    ("secret.private_key", "secret.database_url", "secret.url_password", "secret.slack_webhook",
     "secret.discord_webhook", "secret.microsoft_teams_webhook")
)  # fmt: skip
