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
import itertools
import math
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from aap_server.guardian.detectors._spans import StaticSpans
from aap_server.guardian.detectors._views import TextViews
from aap_server.guardian.detectors.base import Finding
from aap_server.guardian.detectors.checksums import bech32_valid, crc32_base62_valid


def _secret(detector: str, text: str, start: int, end: int) -> Finding:
    return Finding(
        detector=detector, category="secret", start=start, end=end, value=text[start:end]
    )


def _jwt_header_ok(match: re.Match[str]) -> bool:
    header = match.group().split(".", 1)[0]
    try:
        decoded = msgspec.json.decode(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    except (ValueError, msgspec.DecodeError):
        return False
    return isinstance(decoded, dict) and isinstance(decoded.get("alg"), str)


@dataclass(frozen=True, slots=True)
class SecretFormat:
    """One provider format. `heads` are its literal prefixes; `anchor` (for formats without a
    prefix) is a substring that must occur in the token; `lead` is context that must end right
    before the match and becomes part of the finding."""

    id: str
    pattern: re.Pattern[str]
    heads: tuple[str, ...] = ()
    anchor: str = ""
    check: Callable[[re.Match[str]], bool] | None = None
    lead: re.Pattern[str] | None = None
    description: str = ""


_END = r"(?![A-Za-z0-9_-])"
_END_ALNUM = r"(?![A-Za-z0-9])"


def _fmt(
    id: str,
    pattern: str,
    heads: tuple[str, ...] = (),
    *,
    anchor: str = "",
    check: Callable[[re.Match[str]], bool] | None = None,
    lead: str | None = None,
    description: str = "",
) -> SecretFormat:
    return SecretFormat(
        id=f"secret.{id}",
        pattern=re.compile(pattern),
        heads=heads,
        anchor=anchor,
        check=check,
        lead=re.compile(lead) if lead else None,
        description=description,
    )


FORMATS: tuple[SecretFormat, ...] = (
    _fmt("aws_access_key", r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}" + _END_ALNUM,
         ("AKIA", "ASIA", "ABIA", "ACCA"), description="AWS access key id"),
    _fmt("github_token", r"gh[pousr]_([A-Za-z0-9]{36})" + _END,
         ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
         check=lambda m: crc32_base62_valid(m.group(1)),
         description="GitHub classic/OAuth/app tokens, CRC32 checked"),
    _fmt("github_fine_grained_pat", r"github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}" + _END,
         ("github_pat_",), description="GitHub fine-grained personal access token"),
    _fmt("gitlab_token",
         r"gl(?:pat|dt|rt|ptt|ft|soat|cbt|imt|agent|oas)-[A-Za-z0-9_-]{20,}"
         r"(?:\.[A-Za-z0-9_-]+)*" + _END,
         ("glpat-", "gldt-", "glrt-", "glptt-", "glft-", "glsoat-", "glcbt-", "glimt-",
          "glagent-", "gloas-"), description="GitLab personal/deploy/runner/... tokens"),
    _fmt("slack_token", r"(?:xox[abeoprs]|xoxe\.xox[bp]|xapp)-[A-Za-z0-9-]{10,}" + _END,
         ("xoxa-", "xoxb-", "xoxe", "xoxo-", "xoxp-", "xoxr-", "xoxs-", "xapp-"),
         description="Slack bot/user/app/refresh tokens"),
    _fmt("stripe_secret_key", r"[rs]k_(?:live|test)_[0-9A-Za-z]{24,247}" + _END_ALNUM,
         ("sk_live_", "sk_test_", "rk_live_", "rk_test_"),
         description="Stripe secret and restricted keys"),
    _fmt("stripe_webhook_secret", r"whsec_[A-Za-z0-9+/]{32,}={0,2}" + _END_ALNUM,
         ("whsec_",), description="Stripe webhook signing secret"),
    _fmt("anthropic_api_key", r"sk-ant-(?:api|admin|oat|ort)\d{2}-[A-Za-z0-9_-]{80,120}" + _END,
         ("sk-ant-",), description="Anthropic API/admin keys"),
    _fmt("openai_api_key", r"sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{20,}" + _END,
         ("sk-",), check=lambda m: "T3BlbkFJ" in m.group(),
         description="OpenAI keys (legacy and project), the T3BlbkFJ marker checked"),
    _fmt("google_api_key", r"AIza[0-9A-Za-z_-]{35}" + _END, ("AIza",),
         description="Google API key"),
    _fmt("google_oauth_client_secret", r"GOCSPX-[A-Za-z0-9_-]{28}" + _END, ("GOCSPX-",),
         description="Google OAuth client secret"),
    _fmt("npm_token", r"npm_([A-Za-z0-9]{36})" + _END_ALNUM, ("npm_",),
         check=lambda m: crc32_base62_valid(m.group(1)),
         description="npm access token, CRC32 checked"),
    _fmt("pypi_token",
         r"pypi-(?:AgEIcHlwaS5vcmc|AgENdGVzdC5weXBpLm9yZ)[A-Za-z0-9_-]{40,}" + _END,
         ("pypi-",), description="PyPI API token (macaroon issued by pypi.org)"),
    _fmt("huggingface_token", r"(?:hf_|api_org_)[A-Za-z]{34}" + _END_ALNUM,
         ("hf_", "api_org_"), description="Hugging Face user/org token"),
    _fmt("sendgrid_api_key", r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}" + _END, ("SG.",),
         description="SendGrid API key"),
    _fmt("twilio_api_key", r"SK[0-9a-f]{32}" + _END_ALNUM, ("SK",),
         description="Twilio API key sid (SK + 32 hex)"),
    _fmt("mailgun_api_key", r"key-[0-9a-f]{32}" + _END_ALNUM, ("key-",),
         description="Mailgun API key"),
    _fmt("mailchimp_api_key", r"(?<![A-Za-z0-9])[0-9a-f]{32}-us\d{1,2}" + _END_ALNUM,
         anchor="-us", description="Mailchimp API key"),
    _fmt("shopify_token", r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _END_ALNUM,
         ("shpat_", "shpca_", "shppa_", "shpss_"), description="Shopify access tokens"),
    _fmt("digitalocean_token", r"do[opr]_v1_[a-f0-9]{64}" + _END_ALNUM,
         ("doo_v1_", "dop_v1_", "dor_v1_"), description="DigitalOcean tokens"),
    _fmt("square_token", r"(?:EAAA[A-Za-z0-9_-]{60}|sq0(?:atp|csp)-[A-Za-z0-9_-]{22,43})" + _END,
         ("EAAA", "sq0atp-", "sq0csp-"), description="Square access token / OAuth secret"),
    _fmt("azure_ad_client_secret",
         r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])",
         anchor="Q~", description="Microsoft Entra ID (Azure AD) client secret"),
    _fmt("jwt", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*" + _END,
         ("eyJ",), check=_jwt_header_ok, description="JSON Web Token (header checked)"),
    _fmt("telegram_bot_token", r"AA[A-Za-z0-9_-]{33}" + _END, ("AA",),
         lead=r"(?<![0-9])\d{8,10}:\Z", description="Telegram bot token"),
    _fmt("databricks_token", r"dapi[a-f0-9]{32}(?:-\d)?" + _END_ALNUM, ("dapi",),
         description="Databricks personal access token"),
    _fmt("doppler_token", r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,44}" + _END_ALNUM,
         ("dp.",), description="Doppler tokens"),
    _fmt("pulumi_token", r"pul-[a-f0-9]{40}" + _END_ALNUM, ("pul-",),
         description="Pulumi access token"),
    _fmt("age_secret_key", r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}" + _END_ALNUM,
         ("AGE-SECRET-KEY-1",), check=lambda m: bech32_valid(m.group()),
         description="age encryption secret key, bech32 checked"),
    _fmt("vault_token", r"hv[sb]\.[A-Za-z0-9_-]{24,}" + _END, ("hvs.", "hvb."),
         description="HashiCorp Vault service/batch token"),
    _fmt("postman_api_key", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}" + _END_ALNUM, ("PMAK-",),
         description="Postman API key"),
    _fmt("newrelic_api_key", r"NRAK-[A-Z0-9]{27}" + _END_ALNUM, ("NRAK-",),
         description="New Relic user API key"),
    _fmt("sentry_token", r"(?:sntrys_eyJ[A-Za-z0-9+/=_-]{50,}|sntryu_[a-f0-9]{64})" + _END_ALNUM,
         ("sntrys_", "sntryu_"), description="Sentry org/user auth token"),
    _fmt("groq_api_key", r"gsk_[A-Za-z0-9]{52}" + _END_ALNUM, ("gsk_",),
         description="Groq API key"),
    _fmt("replicate_api_token", r"r8_[A-Za-z0-9]{37}" + _END_ALNUM, ("r8_",),
         description="Replicate API token"),
    _fmt("linear_api_key", r"lin_api_[A-Za-z0-9]{40}" + _END_ALNUM, ("lin_api_",),
         description="Linear API key"),
    _fmt("grafana_token",
         r"(?:glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2})" + _END_ALNUM,
         ("glsa_", "glc_"), description="Grafana service account / cloud token"),
    _fmt("mapbox_secret_token", r"sk\.eyJ[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}" + _END,
         ("sk.eyJ",), description="Mapbox secret token"),
    _fmt("atlassian_api_token", r"ATATT3[A-Za-z0-9_=-]{100,}" + _END_ALNUM, ("ATATT3",),
         description="Atlassian API token"),
    _fmt("notion_token", r"(?:secret_[A-Za-z0-9]{43}|ntn_[A-Za-z0-9]{46})" + _END_ALNUM,
         ("secret_", "ntn_"), description="Notion integration token"),
    _fmt("airtable_pat", r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}" + _END_ALNUM, ("pat",),
         description="Airtable personal access token"),
    _fmt("dropbox_token", r"sl\.(?:u\.)?[A-Za-z0-9_-]{130,}" + _END, ("sl.",),
         description="Dropbox short-lived access token"),
    _fmt("terraform_cloud_token", r"(?<![A-Za-z0-9])[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,}",
         anchor=".atlasv1.", description="Terraform Cloud / HCP Terraform token"),
)  # fmt: skip

# Detected outside the token index (URLs, key blocks) or by context.
OTHER_IDS: dict[str, str] = {
    "secret.private_key": "PEM/OpenSSH/PGP private key block",
    "secret.database_url": "database URL with a password (postgres, mysql, mongodb, redis, ...)",
    "secret.url_password": "any other URL with a password in its userinfo",
    "secret.slack_webhook": "Slack incoming-webhook URL",
    "secret.discord_webhook": "Discord webhook URL",
    "secret.aws_secret_key": "AWS secret access key (40 base64 characters after its name)",
    "secret.azure_storage_key": "Azure storage account key (AccountKey=...)",
    "secret.http_basic_auth": "HTTP Basic credentials (base64 user:password after `Basic`)",
    "secret.bearer_token": "opaque token after `Bearer`",
    "secret.assignment": "value of a key, token, secret or password named as such (assignments,"
    " headers, .npmrc/.pypirc lines)",
    "secret.entropy": "high-entropy fallback",
}
SECRET_IDS: tuple[str, ...] = tuple(f.id for f in FORMATS) + tuple(OTHER_IDS)

_BY_HEAD: dict[str, list[SecretFormat]] = {}
for _f in FORMATS:
    for _head in _f.heads:
        if _f not in _BY_HEAD.setdefault(_head[:2], []):
            _BY_HEAD[_head[:2]].append(_f)
_ANCHORED = tuple(f for f in FORMATS if f.anchor)


def _match_formats(text: str, start: int, end: int, out: list[Finding]) -> None:
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
            _match_at(text, pos, out)
        pos += len(segment) + 1
    for fmt in _ANCHORED:
        if fmt.anchor in token:
            for m in fmt.pattern.finditer(text, start, end):
                out.append(_secret(fmt.id, text, m.start(), m.end()))


def _match_at(text: str, pos: int, out: list[Finding]) -> None:
    for fmt in _BY_HEAD[text[pos : pos + 2]]:
        if not text.startswith(fmt.heads, pos):
            continue
        m = fmt.pattern.match(text, pos)
        if m is None or (fmt.check is not None and not fmt.check(m)):
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
        cred = None
        if hook is None:
            at = text.find("@", after, after + 512)
            if at != -1 and not _AUTHORITY_BREAK.search(text, after, at):
                cred = _USERINFO.match(text, after)
        if hook is not None or cred is not None:
            scheme = _SCHEME_TAIL.search(text, max(0, pos - 31), pos)
            start = scheme.start() if scheme else pos
            if hook is not None:
                kind = "slack" if text.startswith("hooks.", after) else "discord"
                out.append(_secret(f"secret.{kind}_webhook", text, start, hook.end()))
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
            end = ends[i][1]
        else:
            body = _KEY_BODY.match(text, begin.end(), limit)
            end = (
                begin.end() + len(text[begin.end() : body.end()].rstrip()) if body else begin.end()
            )
        out.append(_secret("secret.private_key", text, begin.start(), end))


# --- placeholders and keyword-anchored secrets ---------------------------------------------

_ASCENDING = "abcdefghijklmnopqrstuvwxyz"
_PLACEHOLDER_WORDS = ("example", "xxxx", "placeholder", "your", "here", "dummy", "sample",
                      "redacted", "changeme", "0000", "1234567", "****", "<", "{", "$")  # fmt: skip


def is_placeholder(value: str) -> bool:
    """A documentation value, not a credential: few distinct characters, a placeholder word,
    or a run of 6 consecutive letters or digits (`abcdef`, `klmnop`, `123456`), which a random
    token of any length practically never has."""
    lower = value.lower()
    body = lower.rstrip("=")
    if len(set(body)) <= max(3, len(body) // 8):
        return True
    if any(word in lower for word in _PLACEHOLDER_WORDS):
        return True
    run = 1
    for a, b in itertools.pairwise(body):
        run = run + 1 if ord(b) == ord(a) + 1 and (a.isalnum() and b.isalnum()) else 1
        if run >= 6:
            return True
    return False


# A name that says "this is a credential", then `=`, `:` or a header colon, then the value.
_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?:[A-Za-z0-9_.-]{0,30}[_.-])?(?:api[_.-]?key|apikey|api[_.-]?token"
    r"|access[_. -]?token|auth[_.-]?token|_authtoken|secret[_. -]?key|client[_.-]?secret|secret"
    r"|password|passwd|pwd|private[_.-]?key|access[_. -]?key(?:[_.-]?id)?|token|credentials?"
    r"|x-api-key|api-secret|signing[_.-]?key|encryption[_.-]?key|webhook[_.-]?secret)"
    r"[A-Za-z0-9_]{0,12}[\"']?\s*(?::=|=>|[:=])\s*[\"'`]?"
    r"(?P<value>[A-Za-z0-9+/_.~!@#%^&*()\[\]-]{8,200})(?=[\"'`]|\s|[,;]|$)",
    re.MULTILINE,
)
_ASSIGNMENT_HINTS = ("key", "token", "secret", "password", "passwd", "pwd", "credential")


def _assignments(text: str, lower: str, out: list[Finding]) -> None:
    if not any(hint in lower for hint in _ASSIGNMENT_HINTS):
        return
    for m in _ASSIGNMENT.finditer(text):
        value = m.group("value")
        if is_placeholder(value) or not _secret_like(value):
            continue
        out.append(_secret("secret.assignment", text, m.start("value"), m.end("value")))


def _secret_like(value: str) -> bool:
    """A value worth hiding: mixes letters and digits (or symbols), is not a word, a number, a
    boolean, a path or a variable reference."""
    if value.isalpha() or value.isdigit() or value.lower() in ("true", "false", "null", "none"):
        return False
    if value.startswith(("/", "./", "process.env", "os.environ", "env.", "getenv")):
        return False
    kinds = sum((any(c.isdigit() for c in value), any(c.isalpha() for c in value),
                 any(not c.isalnum() for c in value)))  # fmt: skip
    return kinds >= 2 and shannon_entropy(value) >= 2.5


def scan_secrets_views(v: TextViews) -> list[Finding]:
    """Every secret hit in the text (overlaps are resolved by the caller)."""
    text = v.text
    out: list[Finding] = []
    if ":" in text and "://" in text:
        _urls(text, out)
    if "-" in text and "PRIVATE KEY" in text:
        _private_keys(text, out)
    blocks = StaticSpans((f.start, f.end) for f in out)
    skipped: set[int] = set()
    for index, (start, end) in enumerate(v.tokens):
        if blocks and blocks.overlaps(start, end):
            skipped.add(index)  # inside a URL or key block already reported
        else:
            _match_formats(text, start, end, out)
    spans = StaticSpans((f.start, f.end) for f in out)
    tokens = v.tokens
    for start, end, index in v.pieces:
        if index in skipped or (spans and spans.overlaps(start, end)):
            continue
        if text.startswith("//", tokens[index][0]):
            continue  # a URL's host and path: ids in paths are not secrets (queries are apart)
        _context_or_entropy(v, start, end, out)
    _assignments(text, v.lower, out)  # last: overlaps with the above are resolved by rank
    return [f for f in out if f.detector in _WHOLE_BLOCKS or not is_placeholder(f.value)]


# Findings that span more than a token (a URL, a key block): judged by their own rules.
_WHOLE_BLOCKS = frozenset(
    ("secret.private_key", "secret.database_url", "secret.url_password", "secret.slack_webhook",
     "secret.discord_webhook")
)  # fmt: skip
