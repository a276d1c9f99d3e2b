"""The provider catalog: how each provider's credentials are built.

Two kinds of entries, both taken from the providers' documented formats and gitleaks' rule
set (`config/gitleaks.toml`, MIT), restated here as structure rather than copied patterns:

- `FORMATS`: tokens that carry a literal prefix (`ghp_`, `pscale_tkn_`, `dt0c01.`) or a fixed
  infix (`Q~`, `.atlasv1.`, `_mmk`). They are found wherever they stand. Where the format has a
  checksum or a decodable body, `check` verifies it; what a failed check means is `on_fail`:
  `"entropy"` (a checksum typo or a fake still reads as a credential: `secret.entropy`),
  `"drop"` (the body says it is something else: nothing is reported for that token), or
  `"keep"` (the token is judged by the entropy fallback like any other).
- `KEYWORD_RULES`: credentials with no prefix of their own (`asana`'s 32 characters,
  `sidekiq`'s `hex8:hex8`): they count only as the value of an assignment whose name mentions
  the provider (`ASANA_TOKEN = …`, `"dropbox_key": "…"`, `sumologic.accessId = …`), and only
  when the value has the provider's alphabet and length.

Every entry names its provider: the finding's id is `secret.<provider>`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgspec

from aap_server.guardian.detectors.checksums import bech32_valid, crc32_base62_valid

OnFail = Literal["entropy", "drop", "keep"]


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
    on_fail: OnFail = "keep"
    lead: re.Pattern[str] | None = None
    description: str = ""


# A token ends where token characters end; the newer entries also refuse `.` + alphanumeric
# after the match (a file extension or a host name: `video.ico-<hex>.png` is a file name).
_END = r"(?![A-Za-z0-9_-])"
_END_ALNUM = r"(?![A-Za-z0-9])"
_STOP = r"(?![A-Za-z0-9_-]|\.[A-Za-z0-9])"
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"


def _fmt(
    id: str,
    pattern: str,
    heads: tuple[str, ...] = (),
    *,
    anchor: str = "",
    check: Callable[[re.Match[str]], bool] | None = None,
    on_fail: OnFail = "keep",
    lead: str | None = None,
    description: str = "",
) -> SecretFormat:
    return SecretFormat(
        id=f"secret.{id}",
        pattern=re.compile(pattern),
        heads=heads,
        anchor=anchor,
        check=check,
        on_fail=on_fail,
        lead=re.compile(lead) if lead else None,
        description=description,
    )


def _b64_body(value: str) -> bytes:
    body = value.rstrip("=")
    try:
        return base64.b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return b""


def _jwt_header_ok(match: re.Match[str]) -> bool:
    header = match.group().split(".", 1)[0]
    try:
        decoded = msgspec.json.decode(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    except (ValueError, msgspec.DecodeError):
        return False
    return isinstance(decoded, dict) and isinstance(decoded.get("alg"), str)


def _crc_tail(match: re.Match[str]) -> bool:
    return crc32_base62_valid(match.group(1))


def _has_digit(match: re.Match[str]) -> bool:
    return any(ch.isdigit() for ch in match.group())


FORMATS: tuple[SecretFormat, ...] = (
    # --- cloud and infrastructure ---------------------------------------------------------
    _fmt("aws_access_key", r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}" + _END_ALNUM,
         ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"), description="AWS access key id"),
    # Bedrock API keys: `ABSK` + base64("BedrockAPIKey-<id>-at-<account>:<secret>"), and the
    # short-lived `bedrock-api-key-` + base64 of a presigned `bedrock.amazonaws.com/?…` URL.
    _fmt("aws_bedrock_api_key", r"ABSK([A-Za-z0-9+/]{60,400}={0,2})" + _END_ALNUM, ("ABSK",),
         check=lambda m: _b64_body(m.group(1)).startswith(b"BedrockAPIKey-"), on_fail="drop",
         description="Amazon Bedrock API key (long-lived, its body decoded)"),
    _fmt("aws_bedrock_api_key", r"bedrock-api-key-([A-Za-z0-9+/]{20,}={0,2})" + _END_ALNUM,
         ("bedrock-api-key-",),
         check=lambda m: _b64_body(m.group(1)).startswith(b"bedrock.amazonaws.com"),
         on_fail="drop", description="Amazon Bedrock API key (short-lived, its body decoded)"),
    _fmt("alibaba_access_key", r"LTAI[A-Za-z0-9]{20}" + _END_ALNUM, ("LTAI",),
         description="Alibaba Cloud AccessKey id"),
    _fmt("azure_ad_client_secret",
         r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])",
         anchor="Q~", description="Microsoft Entra ID (Azure AD) client secret"),
    _fmt("google_api_key", r"AIza[0-9A-Za-z_-]{35}" + _END, ("AIza",),
         description="Google API key"),
    _fmt("google_oauth_client_secret", r"GOCSPX-[A-Za-z0-9_-]{28}" + _END, ("GOCSPX-",),
         description="Google OAuth client secret"),
    _fmt("digitalocean_token", r"do[opr]_v1_[a-f0-9]{64}" + _END_ALNUM,
         ("doo_v1_", "dop_v1_", "dor_v1_"), description="DigitalOcean tokens"),
    _fmt("cloudflare_origin_ca_key", r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}" + _STOP, ("v1.0-",),
         description="Cloudflare Origin CA key"),
    _fmt("flyio_token",
         r"(?:fo1_[\w-]{43}|fm1[ar]_[A-Za-z0-9+/]{100,}={0,3}|fm2_[A-Za-z0-9+/]{100,}={0,3})"
         + _STOP, ("fo1_", "fm1a_", "fm1r_", "fm2_"), description="Fly.io access token"),
    _fmt("heroku_api_key", r"HRKU-AA[0-9a-zA-Z_-]{58}" + _STOP, ("HRKU-AA",),
         description="Heroku API key (v2)"),
    _fmt("scalingo_api_token", r"tk-us-[\w-]{48}" + _STOP, ("tk-us-",),
         description="Scalingo API token"),
    _fmt("openshift_user_token", r"sha256~[\w-]{43}" + _STOP, ("sha256~",),
         description="OpenShift user token"),
    _fmt("dynatrace_api_token", r"dt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}" + _STOP,
         ("dt0c01.",), description="Dynatrace API token"),
    _fmt("terraform_cloud_token", r"(?<![A-Za-z0-9])[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,}",
         anchor=".atlasv1.", description="Terraform Cloud / HCP Terraform token"),
    _fmt("vault_token", r"hv[sb]\.[A-Za-z0-9_-]{24,}" + _END, ("hvs.", "hvb."),
         description="HashiCorp Vault service/batch token"),
    _fmt("pulumi_token", r"pul-[a-f0-9]{40}" + _END_ALNUM, ("pul-",),
         description="Pulumi access token"),
    _fmt("doppler_token", r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,44}" + _END_ALNUM,
         ("dp.",), description="Doppler tokens"),
    _fmt("infracost_api_token", r"ico-[a-zA-Z0-9]{32}" + _STOP, ("ico-",), check=_has_digit,
         description="Infracost API token"),
    _fmt("octopus_deploy_api_key", r"API-[A-Z0-9]{26}" + _STOP, ("API-",), check=_has_digit,
         description="Octopus Deploy API key"),
    _fmt("planetscale_token", r"pscale_(?:tkn|oauth|pw)_[\w=.-]{32,64}" + _STOP,
         ("pscale_tkn_", "pscale_oauth_", "pscale_pw_"),
         description="PlanetScale API/OAuth token or password"),
    _fmt("databricks_token", r"dapi[a-f0-9]{32}(?:-\d)?" + _END_ALNUM, ("dapi",),
         description="Databricks personal access token"),
    _fmt("clickhouse_cloud_secret", r"4b1d[A-Za-z0-9]{38}" + _STOP, ("4b1d",),
         description="ClickHouse Cloud API secret key"),
    _fmt("prefect_api_token", r"pnu_[a-zA-Z0-9]{36}" + _STOP, ("pnu_",),
         description="Prefect API token"),
    _fmt("harness_api_key",
         r"(?:pat|sat)\.[a-zA-Z0-9_-]{22}\.[a-zA-Z0-9]{24}\.[a-zA-Z0-9]{20}" + _STOP,
         ("pat.", "sat."), description="Harness personal/service account token"),
    _fmt("defined_networking_api_token", r"dnkey-[a-z0-9=_-]{26}-[a-z0-9=_-]{52}" + _STOP,
         ("dnkey-",), description="Defined Networking API token"),
    _fmt("authress_access_key",
         r"(?i:(?:sc|ext|scauth|authress)_[a-z0-9]{5,30}\.[a-z0-9]{4,6}\.)acc[_-]"
         r"(?i:[a-z0-9-]{10,32}\.[a-z0-9+/_=-]{30,120})" + _STOP,
         ("sc_", "ext_", "scauth_", "authress_"), description="Authress service client key"),
    _fmt("onepassword_token", r"ops_eyJ[a-zA-Z0-9+/]{250,}={0,3}" + _END_ALNUM, ("ops_eyJ",),
         description="1Password service account token"),
    _fmt("onepassword_secret_key",
         r"A3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}"
         r"-[A-Z0-9]{5}" + _END_ALNUM, ("A3-",), description="1Password account secret key"),
    _fmt("castai_api_key", r"castai_v1_[A-Za-z0-9]{64}_[A-Za-z0-9]{8}" + _STOP, ("castai_v1_",),
         description="CAST AI API key"),
    _fmt("chieftools_token", r"ct[pot]_[A-Za-z0-9]{30,248}" + _STOP, ("ctp_", "cto_", "ctr_"),
         check=_has_digit, description="Chief Tools personal/access/refresh token"),
    _fmt("age_secret_key", r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}" + _END_ALNUM,
         ("AGE-SECRET-KEY-1",), check=lambda m: bech32_valid(m.group()),
         description="age encryption secret key, bech32 checked"),
    # --- code hosting, packages, CI ------------------------------------------------------
    _fmt("github_token", r"gh[pousr]_([A-Za-z0-9]{36})" + _END,
         ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), check=_crc_tail, on_fail="entropy",
         description="GitHub classic/OAuth/app/refresh tokens, CRC32 checked"),
    _fmt("github_fine_grained_pat", r"github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}" + _END,
         ("github_pat_",), description="GitHub fine-grained personal access token"),
    _fmt("gitlab_token",
         r"(?:gl(?:pat|dt|rt|ptt|ft|soat|cbt|imt|agent|oas|ffct)-[A-Za-z0-9_-]{20,}"
         r"(?:\.[A-Za-z0-9_-]+)*|GR1348941(?=[\w-]{0,19}[A-Za-z_-])[\w-]{20})" + _END,
         ("glpat-", "gldt-", "glrt-", "glptt-", "glft-", "glsoat-", "glcbt-", "glimt-",
          "glagent-", "gloas-", "glffct-", "GR1348941"),
         description="GitLab personal/deploy/runner/feed/... tokens"),
    _fmt("npm_token", r"npm_([A-Za-z0-9]{36})" + _END_ALNUM, ("npm_",), check=_crc_tail,
         on_fail="entropy", description="npm access token, CRC32 checked"),
    _fmt("pypi_token",
         r"pypi-(?:AgEIcHlwaS5vcmc|AgENdGVzdC5weXBpLm9yZ)[A-Za-z0-9_-]{40,}" + _END,
         ("pypi-",), description="PyPI API token (macaroon issued by pypi.org)"),
    _fmt("rubygems_api_token", r"rubygems_[a-f0-9]{48}" + _STOP, ("rubygems_",),
         description="RubyGems API token"),
    _fmt("clojars_api_token", r"(?i:CLOJARS_[a-z0-9]{60})" + _STOP, ("CLOJARS_", "clojars_"),
         description="Clojars deploy token"),
    _fmt("jfrog_token", r"(?:AKCp[A-Za-z0-9]{69}|cmVmd[A-Za-z0-9]{59})" + _STOP,
         ("AKCp", "cmVmd"), description="JFrog Artifactory API key / reference token"),
    _fmt("readme_api_token", r"rdme_[a-z0-9]{70}" + _STOP, ("rdme_",),
         description="ReadMe API token"),
    _fmt("sourcegraph_token",
         r"sgp_(?:(?:[a-fA-F0-9]{16}|local)_)?[a-fA-F0-9]{40}" + _STOP, ("sgp_",),
         description="Sourcegraph access token"),
    _fmt("postman_api_key", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}" + _END_ALNUM, ("PMAK-",),
         description="Postman API key"),
    _fmt("sentry_token", r"(?:sntrys_eyJ[A-Za-z0-9+/=_-]{50,}|sntryu_[a-f0-9]{64})" + _END_ALNUM,
         ("sntrys_", "sntryu_"), description="Sentry org/user auth token"),
    _fmt("atlassian_api_token", r"ATATT3[A-Za-z0-9_=-]{100,}" + _END_ALNUM, ("ATATT3",),
         description="Atlassian API token"),
    _fmt("linear_api_key", r"lin_api_[A-Za-z0-9]{40}" + _END_ALNUM, ("lin_api_",),
         description="Linear API key"),
    _fmt("grafana_token",
         r"(?:glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|glc_[A-Za-z0-9+/]{32,400}={0,3}"
         r"|eyJrIjoi[A-Za-z0-9]{70,400}={0,3})" + _END_ALNUM,
         ("glsa_", "glc_", "eyJrIjoi"), description="Grafana service account / cloud / API key"),
    _fmt("settlemint_token", r"sm_(?:aat|pat|sat)_[a-zA-Z0-9]{16}" + _STOP,
         ("sm_aat_", "sm_pat_", "sm_sat_"), description="SettleMint access tokens"),
    _fmt("frameio_api_token", r"fio-u-[A-Za-z0-9_=-]{64}" + _STOP, ("fio-u-",),
         description="Frame.io API token"),
    _fmt("typeform_api_token", r"tfp_[A-Za-z0-9._=-]{59}" + _STOP, ("tfp_",),
         description="Typeform personal token"),
    _fmt("intra42_client_secret", r"s-s4t2(?:ud|af)-[a-f0-9]{64}" + _STOP,
         ("s-s4t2ud-", "s-s4t2af-"), description="42 intra API client secret"),
    _fmt("maxmind_license_key", r"(?<![A-Za-z0-9])[A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk" + _STOP,
         anchor="_mmk", description="MaxMind license key"),
    # --- messaging, mail, chat ------------------------------------------------------------
    _fmt("slack_token", r"(?:xox[abeoprs]|xoxe\.xox[bp]|xapp)-[A-Za-z0-9-]{10,}" + _END,
         ("xoxa-", "xoxb-", "xoxe", "xoxo-", "xoxp-", "xoxr-", "xoxs-", "xapp-"),
         description="Slack bot/user/app/refresh tokens"),
    _fmt("sendgrid_api_key", r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}" + _END, ("SG.",),
         description="SendGrid API key"),
    _fmt("sendinblue_api_key", r"xkeysib-[a-f0-9]{64}-[A-Za-z0-9]{16}" + _STOP, ("xkeysib-",),
         description="Brevo (Sendinblue) API key"),
    _fmt("twilio_api_key", r"SK[0-9a-f]{32}" + _END_ALNUM, ("SK",),
         description="Twilio API key sid (SK + 32 hex)"),
    _fmt("mailgun_api_key", r"(?:key|pubkey)-[0-9a-f]{32}" + _END_ALNUM, ("key-", "pubkey-"),
         description="Mailgun private/public API key"),
    _fmt("mailchimp_api_key", r"(?<![A-Za-z0-9])[0-9a-f]{32}-us\d{1,2}" + _END_ALNUM,
         anchor="-us", description="Mailchimp API key"),
    _fmt("telegram_bot_token", r"AA[A-Za-z0-9_-]{33}" + _END, ("AA",),
         lead=r"(?<![0-9])\d{8,10}:\Z", description="Telegram bot token"),
    _fmt("newrelic_api_key", r"(?:NRAK-[A-Z0-9]{27}|NRJS-[a-f0-9]{19}|NRII-[A-Za-z0-9-]{32})"
         + _END_ALNUM, ("NRAK-", "NRJS-", "NRII-"),
         description="New Relic user / browser / insert key"),
    _fmt("notion_token", r"(?:secret_[A-Za-z0-9]{43}|ntn_[A-Za-z0-9]{46})" + _END_ALNUM,
         ("secret_", "ntn_"), description="Notion integration token"),
    _fmt("airtable_pat", r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}" + _END_ALNUM, ("pat",),
         description="Airtable personal access token"),
    _fmt("dropbox_token", r"sl\.(?:u\.)?[A-Za-z0-9_-]{130,}" + _END, ("sl.",),
         description="Dropbox short-lived access token"),
    _fmt("facebook_access_token", r"EAA[MC][A-Za-z0-9]{100,}" + _STOP, ("EAAM", "EAAC"),
         description="Facebook page/user access token"),
    # --- payments and commerce ------------------------------------------------------------
    _fmt("stripe_secret_key", r"[rs]k_(?:live|test|prod)_[0-9A-Za-z]{24,247}" + _END_ALNUM,
         ("sk_live_", "sk_test_", "sk_prod_", "rk_live_", "rk_test_", "rk_prod_"),
         description="Stripe secret and restricted keys"),
    _fmt("stripe_webhook_secret", r"whsec_[A-Za-z0-9+/]{32,}={0,2}" + _END_ALNUM,
         ("whsec_",), description="Stripe webhook signing secret"),
    _fmt("square_token", r"(?:EAAA[A-Za-z0-9_-]{60}|sq0(?:atp|csp)-[A-Za-z0-9_-]{22,43})" + _END,
         ("EAAA", "sq0atp-", "sq0csp-"), description="Square access token / OAuth secret"),
    _fmt("shopify_token", r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _END_ALNUM,
         ("shpat_", "shpca_", "shppa_", "shpss_"), description="Shopify access tokens"),
    _fmt("shippo_api_token", r"shippo_(?:live|test)_[a-fA-F0-9]{40}" + _STOP,
         ("shippo_live_", "shippo_test_"), description="Shippo API token"),
    _fmt("easypost_api_key", r"EZ[AT]K[A-Za-z0-9]{54}" + _STOP, ("EZAK", "EZTK"),
         description="EasyPost production/test API key"),
    _fmt("duffel_api_token", r"duffel_(?:test|live)_[A-Za-z0-9_=-]{43}" + _STOP,
         ("duffel_test_", "duffel_live_"), description="Duffel API token"),
    _fmt("flutterwave_key",
         r"(?:FLWSECK_TEST-[a-h0-9]{12}(?![A-Za-z0-9-])|FLW(?:SECK|PUBK)(?:_TEST)?-[a-h0-9]{32}-X)"
         + _STOP, ("FLWSECK", "FLWPUBK"), description="Flutterwave secret/public/encryption key"),
    _fmt("adyen_api_key", r"AQE[a-z0-9]{5,}\.[A-Za-z0-9_=-]{50,80}" + _STOP, ("AQE",),
         description="Adyen API key"),
    _fmt("braintree_token", r"(?:production|sandbox)_[a-z0-9]{8}_[a-z0-9]{16}" + _STOP,
         ("production_", "sandbox_"), check=_has_digit,
         description="Braintree tokenization key / access token"),
    _fmt("adobe_client_secret", r"p8e-[A-Za-z0-9]{32}" + _STOP, ("p8e-",), check=_has_digit,
         description="Adobe OAuth client secret"),
    # --- AI and data services -------------------------------------------------------------
    _fmt("anthropic_api_key", r"sk-ant-(?:api|admin|oat|ort)\d{2}-[A-Za-z0-9_-]{80,120}" + _END,
         ("sk-ant-",), description="Anthropic API/admin keys"),
    _fmt("openai_api_key", r"sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{20,}" + _END,
         ("sk-",), check=lambda m: "T3BlbkFJ" in m.group(),
         description="OpenAI keys (legacy and project), the T3BlbkFJ marker checked"),
    _fmt("huggingface_token", r"(?:hf_|api_org_)[A-Za-z]{34}" + _END_ALNUM,
         ("hf_", "api_org_"), description="Hugging Face user/org token"),
    _fmt("groq_api_key", r"gsk_[A-Za-z0-9]{52}" + _END_ALNUM, ("gsk_",),
         description="Groq API key"),
    _fmt("replicate_api_token", r"r8_[A-Za-z0-9]{37}" + _END_ALNUM, ("r8_",),
         description="Replicate API token"),
    _fmt("langsmith_api_key", r"lsv2_(?:pt|sk)_[a-z0-9]{32}_[a-z0-9]{10}" + _STOP,
         ("lsv2_pt_", "lsv2_sk_"), description="LangSmith personal access token / service key"),
    _fmt("perplexity_api_key", r"pplx-[a-zA-Z0-9]{48}" + _STOP, ("pplx-",),
         description="Perplexity API key"),
    _fmt("yandex_api_key", r"AQVN[A-Za-z0-9_-]{35,38}" + _STOP, ("AQVN",),
         description="Yandex Cloud API key"),
    _fmt("mapbox_secret_token", r"sk\.eyJ[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}" + _END,
         ("sk.eyJ",), description="Mapbox secret token"),
    _fmt("jwt", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*={0,2}" + _END,
         ("eyJ",), check=_jwt_header_ok, on_fail="entropy",
         description="JSON Web Token (header checked)"),
)  # fmt: skip


# Formats with characters that end a token (`$`, `@`): found by their literal opening with
# `str.find`, then matched there.
LITERAL_FORMATS: tuple[SecretFormat, ...] = (
    _fmt("braintree_token", r"access_token\$(?:production|sandbox)\$[a-z0-9]{16}" + _STOP,
         anchor="access_token$", description="Braintree tokenization key / access token"),
    _fmt("azure_data_factory_key",
         r"IR@[0-9a-zA-Z-]{36}@[^@\s]{1,100}@[0-9a-zA-Z=-]{0,50}@[A-Za-z0-9+/=]{44}"
         + _END_ALNUM, anchor="IR@",
         description="Azure Data Factory self-hosted integration runtime key"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class KeywordRule:
    """A provider credential without a prefix: `value` must match the whole assigned value,
    and one of `keywords` must start a part of the name it is assigned to."""

    id: str
    keywords: tuple[str, ...]
    value: re.Pattern[str]
    description: str


def _kw(id: str, keywords: str, *values: str, description: str) -> KeywordRule:
    return KeywordRule(
        id=f"secret.{id}",
        keywords=tuple(keywords.split()),
        value=re.compile("|".join(f"(?:{v})" for v in values)),
        description=description,
    )


_A = "[A-Za-z0-9]"
_ID = "[A-Za-z0-9=_-]"  # url-safe base64 and friends
KEYWORD_RULES: tuple[KeywordRule, ...] = (
    _kw("adafruit_api_key", "adafruit", "[A-Za-z0-9_-]{32}", description="Adafruit IO key"),
    _kw("adobe_client_id", "adobe", "[a-fA-F0-9]{32}", description="Adobe OAuth client id"),
    _kw("airtable_api_key", "airtable", f"{_A}{{17}}", description="Airtable API key"),
    _kw("algolia_api_key", "algolia", f"{_A}{{32}}", description="Algolia API key"),
    _kw("alibaba_secret_key", "alibaba aliyun", f"{_A}{{30}}",
        description="Alibaba Cloud AccessKey secret"),
    _kw("asana_token", "asana", "[0-9]{16}", f"{_A}{{32}}", "[0-9]/[0-9]{16}:[A-Za-z0-9]{32}",
        description="Asana client id / secret / personal access token"),
    _kw("atlassian_api_token", "atlassian confluence jira", f"{_A}{{20}}[a-fA-F0-9]{{4}}",
        f"{_A}{{24}}", description="Atlassian API token"),
    _kw("beamer_api_token", "beamer", f"b_{_ID}{{44}}", description="Beamer API token"),
    _kw("bitbucket_client_secret", "bitbucket", f"{_A}{{32}}", f"{_ID}{{64}}",
        description="Bitbucket OAuth client id / secret"),
    _kw("bittrex_api_key", "bittrex", f"{_A}{{32}}", description="Bittrex access / secret key"),
    _kw("chargebee_api_key", "chargebee", "(?:test|live)_[0-9a-zA-Z]{32,34}",
        description="Chargebee API key"),
    _kw("adyen_api_key", "adyen", "(?:test|live)_[a-zA-Z0-9]{30,40}",
        description="Adyen client key"),
    _kw("cisco_meraki_api_key", "meraki", "[0-9a-f]{40}", description="Cisco Meraki API key"),
    _kw("cloudflare_api_key", "cloudflare", "[A-Za-z0-9_-]{40}", "[a-fA-F0-9]{37}",
        description="Cloudflare API token / global API key"),
    _kw("codecov_access_token", "codecov", f"{_A}{{32}}", _UUID,
        description="Codecov upload token"),
    _kw("cohere_api_token", "cohere co_api_key", f"{_A}{{40}}", description="Cohere API key"),
    _kw("coinbase_access_token", "coinbase", "[A-Za-z0-9_-]{64}",
        description="Coinbase access token"),
    _kw("confluent_api_key", "confluent", f"{_A}{{16}}", f"{_A}{{64}}",
        description="Confluent Cloud API key / secret"),
    _kw("contentful_delivery_token", "contentful", f"{_ID}{{43}}",
        description="Contentful delivery API token"),
    _kw("datadog_access_token", "datadog dd_api dd_app", f"{_A}{{40}}", "[a-fA-F0-9]{32}",
        description="Datadog API / application key"),
    _kw("discord_token", "discord", "[a-fA-F0-9]{64}", "[0-9]{17,19}", f"{_ID}{{32}}",
        description="Discord API key, client id or client secret"),
    _kw("droneci_access_token", "droneci drone_token", f"{_A}{{32}}",
        description="Drone CI access token"),
    _kw("dropbox_api_token", "dropbox", f"{_A}{{15}}", f"{_A}{{11}}AAAAAAAAAA{_ID}{{43}}",
        f"sl\\.{_ID}{{135}}", description="Dropbox app secret / long- and short-lived tokens"),
    _kw("etsy_access_token", "etsy", f"{_A}{{24}}", description="Etsy API key"),
    _kw("facebook_secret", "facebook", "[a-fA-F0-9]{32}", "[0-9]{15,16}[|%][A-Za-z0-9_-]{27,40}",
        description="Facebook app secret / app access token"),
    _kw("fastly_api_token", "fastly", f"{_ID}{{32}}", description="Fastly API token"),
    _kw("finicity_api_token", "finicity", "[a-fA-F0-9]{32}", f"{_A}{{20}}",
        description="Finicity API token / client secret"),
    _kw("finnhub_access_token", "finnhub", f"{_A}{{20}}", description="Finnhub API token"),
    _kw("flickr_access_token", "flickr", f"{_A}{{32}}", description="Flickr API key"),
    _kw("freshbooks_access_token", "freshbooks", f"{_A}{{64}}",
        description="FreshBooks access token"),
    _kw("gitlab_session_cookie", "_gitlab_session", "[0-9a-z]{32}",
        description="GitLab session cookie"),
    _kw("gitter_access_token", "gitter", "[A-Za-z0-9_-]{40}", description="Gitter token"),
    _kw("gocardless_api_token", "gocardless", f"live_{_ID}{{40}}",
        description="GoCardless live access token"),
    _kw("heroku_api_key", "heroku", _UUID, description="Heroku API key"),
    _kw("hubspot_api_key", "hubspot", _UUID, "pat-(?:na|eu)1-" + _UUID,
        description="HubSpot API key / private app token"),
    _kw("intercom_api_key", "intercom", f"{_ID}{{60}}", description="Intercom access token"),
    _kw("jfrog_token", "jfrog artifactory bintray xray", f"{_A}{{73}}", f"{_A}{{64}}",
        description="JFrog API key / identity token"),
    _kw("kraken_access_token", "kraken", "[A-Za-z0-9/=_+-]{80,90}",
        description="Kraken API key"),
    _kw("kucoin_access_token", "kucoin", "[a-fA-F0-9]{24}", _UUID,
        description="KuCoin API key / secret"),
    _kw("launchdarkly_access_token", "launchdarkly", f"{_ID}{{40}}", f"(?:api|sdk|mob)-{_UUID}",
        description="LaunchDarkly access token / SDK key"),
    _kw("linear_client_secret", "linear", "[a-fA-F0-9]{32}",
        description="Linear OAuth client secret"),
    _kw("linkedin_client_secret", "linkedin linked_in linked-in", f"{_A}{{14}}", f"{_A}{{16}}",
        description="LinkedIn client id / secret"),
    _kw("lob_api_key", "lob", "(?:live|test)_[a-fA-F0-9]{35}", "(?:live|test)_pub_[a-fA-F0-9]{31}",
        description="Lob secret / publishable API key"),
    _kw("looker_client_secret", "looker", f"{_A}{{20}}", f"{_A}{{24}}",
        description="Looker API client id / secret"),
    _kw("mailgun_signing_key", "mailgun", "[a-hA-H0-9]{32}-[a-hA-H0-9]{8}-[a-hA-H0-9]{8}",
        description="Mailgun webhook signing key"),
    _kw("mapbox_api_token", "mapbox", f"pk\\.{_A}{{60}}\\.{_A}{{22}}",
        description="Mapbox public token"),
    _kw("mattermost_access_token", "mattermost", f"{_A}{{26}}",
        description="Mattermost access token"),
    _kw("messagebird_api_token", "messagebird message_bird message-bird", f"{_A}{{25}}", _UUID,
        description="MessageBird API key / client id"),
    _kw("netlify_access_token", "netlify", f"{_ID}{{40,46}}",
        description="Netlify personal access token"),
    _kw("newrelic_api_key", "newrelic new_relic new-relic", f"{_A}{{64}}",
        description="New Relic user API id"),
    _kw("nytimes_access_token", "nytimes newyorktimes new-york-times", f"{_ID}{{32}}",
        description="New York Times API key"),
    _kw("okta_access_token", "okta", "00[A-Za-z0-9_=-]{40}", description="Okta API token"),
    _kw("plaid_api_token", "plaid",
        f"access-(?:sandbox|development|production)-{_UUID}", f"{_A}{{24}}", f"{_A}{{30}}",
        description="Plaid access token / client id / secret"),
    _kw("privateai_api_token", "privateai private_ai private-ai", f"{_A}{{32}}",
        description="Private AI API key"),
    _kw("rapidapi_access_token", "rapidapi", "[A-Za-z0-9_-]{50}", description="RapidAPI key"),
    _kw("sendbird_access_token", "sendbird", _UUID, "[a-fA-F0-9]{40}",
        description="Sendbird application id / API token"),
    _kw("sentry_token", "sentry", "[a-fA-F0-9]{64}", description="Sentry auth token (old format)"),
    _kw("sidekiq_secret", "contribsys", "[a-fA-F0-9]{8}:[a-fA-F0-9]{8}",
        description="Sidekiq Enterprise/Pro gem server credentials"),
    _kw("snyk_api_token", "snyk", _UUID, description="Snyk API token"),
    _kw("sonar_api_token", "sonar", f"{_ID}{{40}}", "sq[apu]_[a-fA-F0-9]{40}",
        description="SonarQube / SonarCloud token"),
    _kw("sourcegraph_token", "sourcegraph", "[a-fA-F0-9]{40}", description="Sourcegraph token"),
    _kw("squarespace_access_token", "squarespace", _UUID,
        description="Squarespace API key"),
    _kw("sumologic_access_key", "sumo sumologic", f"su{_A}{{12}}", f"{_A}{{64}}",
        description="Sumo Logic access id / key"),
    _kw("telegram_bot_token", "telegr", "[0-9]{5,16}:A[A-Za-z0-9_-]{34}",
        description="Telegram bot token"),
    _kw("travisci_access_token", "travis", f"{_A}{{22}}", description="Travis CI token"),
    _kw("twitch_api_token", "twitch", f"{_A}{{30}}", description="Twitch API token"),
    _kw("twitter_token", "twitter",
        f"{_A}{{25}}", f"{_A}{{45}}", f"{_A}{{50}}", f"[0-9]{{15,25}}-{_A}{{20,40}}",
        "A{22}[A-Za-z0-9%]{80,100}",
        description="Twitter/X API key and secret, access token and secret, bearer token"),
    _kw("vault_token", "vault", f"s\\.{_A}{{24}}", description="HashiCorp Vault legacy token"),
    _kw("yandex_access_token", "yandex", r"t1\.[A-Za-z0-9_-]+={0,2}\.[A-Za-z0-9_-]{86}={0,2}",
        "YC[A-Za-z0-9_-]{38}", description="Yandex OAuth / AWS-compatible access token"),
    _kw("zendesk_secret_key", "zendesk", f"{_A}{{40}}", description="Zendesk API token"),
)  # fmt: skip

KEYWORD_IDS: dict[str, str] = {}
for _rule in KEYWORD_RULES:
    KEYWORD_IDS.setdefault(_rule.id, _rule.description)
