"""Secret detection that generalises (issue 8): the provider catalog, provider-named
assignments, checks that decide what a token is, and the look-alikes left alone."""

from __future__ import annotations

import base64
import zlib

import msgspec
import pytest

from aap_server import aos
from aap_server.guardian.detectors import DESCRIPTIONS, detector_ids, scan_secrets
from aap_server.guardian.detectors.secret_catalog import FORMATS, KEYWORD_RULES
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from tests.guardian.detectors.fakes import Fakes
from tests.guardian.test_policy import steps

FAKE = Fakes(seed=81)
LOWER36 = "abcdefghijklmnopqrstuvwxyz0123456789"
# Detectors that name a kind of credential rather than a provider.
GENERIC = {
    "secret.entropy",
    "secret.assignment",
    "secret.private_key",
    "secret.database_url",
    "secret.url_password",
    "secret.http_basic_auth",
    "secret.bearer_token",
    "secret.jwt",
}


def found(text: str) -> list[tuple[str, str]]:
    return [(f.detector, f.value) for f in scan_secrets(text)]


def lower(n: int) -> str:
    while True:
        value = FAKE.chars(LOWER36, n)
        if sum(ch.isdigit() for ch in value) >= 2 and not value.isdigit():
            return value


def test_the_catalog_names_at_least_150_providers_each_with_a_readable_description() -> None:
    providers = {i for i in detector_ids() if i.startswith("secret.")} - GENERIC
    assert len(providers) >= 150
    for detector in providers:
        assert detector.replace("_", "").replace(".", "").isalnum(), detector
        assert len(DESCRIPTIONS[detector]) > 10, detector
    for fmt in FORMATS:  # found by a literal prefix or infix, never by scanning everywhere
        assert fmt.heads or fmt.anchor, fmt.id
    assert all(rule.keywords for rule in KEYWORD_RULES)


@pytest.mark.parametrize(
    ("line", "detector"),
    [
        ("PLANETSCALE_TOKEN=pscale_tkn_{b64url43}", "secret.planetscale_token"),
        ("SRC_ACCESS_TOKEN=sgp_{hex16}_{hex40}", "secret.sourcegraph_token"),
        ("DT_API_TOKEN=dt0c01.{alnum24}.{alnum64}", "secret.dynatrace_api_token"),
        ("gem push --key rubygems_{hex48}", "secret.rubygems_api_token"),
        ("oc login --token=sha256~{b64url43}", "secret.openshift_user_token"),
        ("PERPLEXITY_API_KEY=pplx-{alnum48}", "secret.perplexity_api_key"),
    ],
)
def test_a_prefixed_provider_token_is_named_by_its_provider(line: str, detector: str) -> None:
    values = {
        "b64url43": FAKE.b64url(43),
        "hex16": FAKE.hex(16),
        "hex40": FAKE.hex(40),
        "hex48": FAKE.hex(48),
        "alnum24": FAKE.alnum(24),
        "alnum48": FAKE.alnum(48),
        "alnum64": FAKE.alnum(64),
    }
    text = line.format(**values)
    token = text.split("=", 1)[-1].split()[-1]
    assert (detector, token) in found(text)


@pytest.mark.parametrize(
    ("line", "detector"),
    [
        ('asanaToken := "{low32}"', "secret.asana_token"),
        ('String finnhubToken = "{low20}";', "secret.finnhub_access_token"),
        ("BUNDLE_GEMS__CONTRIBSYS__COM={hex8}:{hex8b}", "secret.sidekiq_secret"),
        ("TELEGRAM_TOKEN=67576:A{b64url34}", "secret.telegram_bot_token"),
        ('"dropbox_app_secret": "{low15}"', "secret.dropbox_api_token"),
        ("sumologic.accessId = su{alnum12}", "secret.sumologic_access_key"),
    ],
)
def test_a_value_under_its_providers_name_is_that_providers_credential(
    line: str, detector: str
) -> None:
    text = line.format(
        low32=lower(32),
        low20=lower(20),
        low15=lower(15),
        hex8=FAKE.hex(8),
        hex8b=FAKE.hex(8),
        b64url34=FAKE.b64url(34),
        alnum12=FAKE.alnum(12),
    )
    assert [d for d, _ in found(text)] == [detector]


def test_the_same_value_without_the_providers_name_or_shape_is_not_that_provider() -> None:
    value = lower(32)
    assert found(f'checksumValue := "{value}"') == []  # no credential word, no provider
    assert [d for d, _ in found(f'asanaToken := "{value[:31]}!"')] != ["secret.asana_token"]


@pytest.mark.parametrize(
    "line",
    [
        "rookTable = 00{v40}",  # `okta` inside a word is not Okta
        'SetSysctl = "{low24}"',  # nor is `etsy`
        "video_box.ico-{hex32}.png",  # a file name, not an Infracost token
        'msgstr "GSSAPI-VIRHEKAPSELOINTIMERKKIJONO."',  # not an Octopus Deploy key
        "GR1348941{digits20}",  # a runner registration token is not all digits
    ],
)
def test_provider_look_alikes_are_left_alone(line: str) -> None:
    text = line.format(
        v40=FAKE.chars(LOWER36, 40),
        low24=lower(24),
        hex32=FAKE.hex(32),
        digits20=FAKE.chars("0123456789", 20),
    )
    assert [d for d, _ in found(text) if d != "secret.entropy"] == []


def test_a_github_token_with_a_broken_checksum_is_still_withheld_as_random() -> None:
    body = lower(30)
    good = "ghs_" + body + _base62(zlib.crc32(body.encode()))
    bad = good[:-1] + ("a" if good[-1] != "a" else "b")
    assert found(f"token {good}") == [("secret.github_token", good)]
    assert found(f"token {bad}") == [("secret.entropy", bad)]


def _base62(number: int) -> str:
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    out = ""
    while number:
        number, rem = divmod(number, 62)
        out = digits[rem] + out
    return out.rjust(6, "0")


def test_a_bedrock_key_is_named_only_when_its_body_decodes_to_one() -> None:
    body = f"BedrockAPIKey-{lower(4)}-at-123456789012:{FAKE.b64(40)}".encode()
    key = "ABSK" + base64.b64encode(body).decode()
    assert found(f"AWS_BEARER_TOKEN_BEDROCK={key}") == [("secret.aws_bedrock_api_key", key)]
    short = "bedrock-api-key-" + base64.b64encode(b"bedrock.amazonaws.com/?Action=x").decode()
    assert found(short) == [("secret.aws_bedrock_api_key", short)]
    other = "bedrock-api-key-" + base64.b64encode(b"a note about bedrock, no url").decode()
    assert found(other) == []


@pytest.mark.parametrize(
    "line",
    [
        "apiKey: '{v}'",
        'const accessToken = "{v}";',
        "Authorization: Bearer {v}",
        "authorization: token {v}",
        "Server=db;User Id=sa;Password={v};",
    ],
)
def test_camel_case_names_headers_and_connection_strings_hold_credentials(line: str) -> None:
    value = "q8Rz-2vLx7TnPw4K"
    assert ("secret.assignment", value) in found(line.format(v=value))


@pytest.mark.parametrize(
    "text",
    [
        'nonMatchingToken := "ydnqz0t188bvxcho"',  # camelCase name: a short lowercase value
        'API_CREATE("https://x.example/create?access_token=ACCESS_TOKEN")',  # a constant
        "export OP_SERVICE_ACCOUNT_TOKEN=ops_eyJzaWduSW5BZGRyZXNzIjoiaHR0cHM6...",  # elided
        "serviceAccountToken: ops_eyJzaWduSW5B..[Redacted]",
        "-----BEGIN PRIVATE KEY-----\nanything\n-----END PRIVATE KEY-----",  # no key body
        "-----BEGIN OPENSSH PRIVATE KEY----------END OPENSSH PRIVATE KEY-----",
        "nextPageToken: CAoQAAb1x9Zq",  # a pagination cursor, not a credential
        "token_count: 12ab34cd56ef",
        "...6wqX6fNUXA/rYqRvfQ+EZAKGqQRiRyqAFRQshGPWOIAwNWGORfKHSBnVNFtVmWYoW6PH23lk...",
    ],
)
def test_identifiers_elided_values_cursors_and_empty_key_blocks_are_not_secrets(
    text: str,
) -> None:
    assert found(text) == []


def test_webhook_urls_of_teams_and_scheme_less_slack_are_secrets() -> None:
    uuid = "-".join(FAKE.hex(n) for n in (8, 4, 4, 4, 12))
    teams = (
        f"https://acme.webhook.office.com/webhookb2/{uuid}@{uuid}/IncomingWebhook/"
        f"{FAKE.hex(32)}/{uuid}"
    )
    assert found(f"post to {teams} now") == [("secret.microsoft_teams_webhook", teams)]
    slack = f"hooks.slack.com/services/T{FAKE.alnum(10)}/B{FAKE.alnum(10)}/{FAKE.alnum(24)}"
    assert found(f"hook: {slack}") == [("secret.slack_webhook", slack)]


def test_a_facebook_app_token_is_found_where_facebook_is_named() -> None:
    token = f"{FAKE.chars('0123456789', 16)}|{FAKE.b64url(27)}"
    assert ("secret.facebook_secret", token) in found(f"facebook {token}")


async def test_a_pasted_credential_of_a_new_provider_becomes_its_placeholder() -> None:
    guardian = PolicyGuardian(default_policy())
    token = f"pscale_tkn_{FAKE.b64url(43)}"
    pasted = await guardian.check(steps().message("user", f"use {token} for the db"))
    assert pasted.decision == "modify"
    body = msgspec.json.encode(pasted.modified_request).decode()
    assert token not in body
    assert "<PLANETSCALE_TOKEN_1>" in body
    assert "secret.from_user" in (pasted.reason_code or [])

    call = steps().tool_call_request("c1", "http_post", {"body": f"key={token}"})
    assert (await guardian.check(call)).decision == "deny"
    reply = await guardian.check(steps().message("agent", f"your key is {token}"))
    assert isinstance(reply.modified_request, aos.MessageStep)
    assert token not in msgspec.json.encode(reply.modified_request).decode()


@pytest.mark.parametrize(
    "line",
    [
        "private_key: PKCS12PrivateKeyTypes | None = None",  # a type annotation
        "imdsv2_session_token = self._get_imdsv2_session_token(request)",
        'headers = {"X-aws-ec2-metadata-token": imdsv2_session_token}',
        "MLKEM768X25519PrivateKey = rust_openssl.hpke.MLKEM768X25519PrivateKey",
        'REQUEST_TYPE_ACCESS_TOKEN = "auth-request-type/at"',
        '"sec-websocket-key": base64.b64encode(secrets.token_bytes(16))',
        "AAP_API_KEYS=KEY:USER_ID:ORG_ID",
        "oauth2client.client.OAuth2Credentials: _convert_oauth2_credentials,",
        '"secret": "#/components/schemas/SecretAgentOption",',
        ".. _Application Default Credentials: https://developers.google.com/identity",
    ],
)
def test_code_under_a_credential_name_is_not_a_credential(line: str) -> None:
    assert found(line) == []


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("DB_PASSWORD=Summer2024", "Summer2024"),  # a person's password reads like a name
        ('password = "hunter22"', "hunter22"),
        ("pass: Tr0ub4dor&3", "Tr0ub4dor&3"),
        ("token: s.ZC9Ecf4M5g9o34Q6RkzGsj0z", "s.ZC9Ecf4M5g9o34Q6RkzGsj0z"),  # not a dotted path
    ],
)
def test_passwords_that_read_like_names_and_dotted_tokens_are_still_credentials(
    line: str, value: str
) -> None:
    assert ("secret.assignment", value) in found(line)
