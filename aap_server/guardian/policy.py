"""The declarative policy file: its schema, loading, and validation.

TOML, because it is in the standard library (`tomllib`: no dependency to audit), has comments,
and is typed without YAML's surprises (`no` stays a string, `1.10` stays what you wrote).
A broken policy refuses to load with an error naming the rule and the field.

    version = 1
    mode = "enforce"                 # or "shadow": record verdicts, enforce nothing

    [[rules]]
    id = "no-secrets-out"            # unique; every verdict names the rule that made it
    reason_code = "secret.output"    # goes to the verdict's reasonCode and the audit trail
    action = "deny"                  # allow | deny | modify | require_approval
    message = "Secrets are not sent to users"
    match.method = ["steps/message"]
    match.role = ["agent"]
    match.detectors = ["secret.*"]   # any finding whose detector id matches a pattern

Precedence: every rule whose `match` holds applies. The strongest action decides:
deny > require_approval > modify > allow; among equals, the first rule in the file names the
verdict. All matching `modify` rules apply, in file order. No matching rule: `default`.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec

from aap_server.aos import AOS_METHODS

Action = Literal["allow", "deny", "modify", "require_approval"]
RedactStyle = Literal["placeholder", "mask", "replace"]

# Strongest first: the verdict of several matching rules is the strongest action among them.
ACTION_STRENGTH: dict[str, int] = {"deny": 3, "require_approval": 2, "modify": 1, "allow": 0}


# Findings the guardian makes from a step's own marks rather than by scanning its text, by id
# (rules name them in `match.detectors` like a detector's): an MCP client marks a `tools/list`
# answer in which a tool differs from its pin (`MCP_PIN_CHANGED`, a "rug pull").
STEP_FINDINGS: dict[str, str] = {
    "mcp.tool_changed": "an MCP server changed a tool's description or schema since it was pinned",
}
# The `_meta` key of an inbound MCP `tools/list` result naming the tools whose description or
# schema changed since they were pinned (set by `aap_server.toolkits.mcp_tools`).
MCP_PIN_CHANGED = "aap-server/pinChanged"


@functools.lru_cache(maxsize=4096)
def name_matches(name: str, pattern: str) -> bool:
    """`fnmatchcase`, remembered: every step tests its tool and agent against every rule's
    patterns and its tool against the `[[tools]]` declarations, and all of them repeat."""
    return fnmatch.fnmatchcase(name, pattern)


# Tools an agent takes from elsewhere are named `<source>__<tool>`: an MCP server's tools, an A2A
# peer (`a2a__<peer>`).
NAMESPACE = "__"


def tool_name_matches(name: str, pattern: str) -> bool:
    """`name_matches` of a tool's whole name or of its own name after any namespace: what a
    tool does is said by its own name (`bank__send_money` sends money, whichever MCP server
    serves it), so egress and `[[tools]]` patterns match it too."""
    if name_matches(name, pattern):
        return True
    # After every `__`, overlapping ones too: a source may end in `_` (`bank___send_money`).
    at = name.find(NAMESPACE)
    while at != -1:
        if name_matches(name[at + len(NAMESPACE) :], pattern):
            return True
        at = name.find(NAMESPACE, at + 1)
    return False


class PolicyError(ValueError):
    """The policy cannot be used; the message names the rule and the field."""


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ArgumentMatch(_Strict, frozen=True):
    """A condition on one tool argument, by dotted path into the call's inputs (`to`,
    `message.recipients.0`). Set one of `equals`, `contains`, `matches` (a regex), or
    `exists`."""

    path: str
    equals: Any = None
    contains: str | None = None
    matches: str | None = None
    exists: bool | None = None


class SessionMatch(_Strict, frozen=True):
    """Conditions on what the session has done so far (counted by the guardian)."""

    # Tool calls already allowed in this turn / this session / of this tool in the session.
    tool_calls_in_turn_at_least: int | None = None
    tool_calls_in_session_at_least: int | None = None
    calls_of_this_tool_at_least: int | None = None
    # The session has taken in untrusted content (tool results, knowledge, inbound MCP/A2A).
    untrusted_seen: bool | None = None
    # Private values (detector hits, confidential knowledge) appear in this step's arguments.
    private_data_in_arguments: bool | None = None
    # Values from untrusted sources appear in this step's arguments.
    untrusted_data_in_arguments: bool | None = None
    # Provenance (`aap_server.guardian.provenance`): a recipient or target of this tool call
    # never appeared in trusted input (the user's messages, the agent's instructions, output
    # of tools whose output is trusted).
    target_not_in_trusted_input: bool | None = None
    # A value of this call (a number, an account, an id: not prose) came only from untrusted
    # content.
    values_only_from_untrusted: bool | None = None
    # A hit of this rule's `match.detectors` in the step's content came in untrusted content
    # (and not from the user): with `modify.only_untrusted`, only such values are replaced.
    untrusted_values_in_content: bool | None = None


class Match(_Strict, frozen=True):
    """All given conditions must hold (each list: any of its entries). Names may use `*`."""

    method: list[str] | None = None
    agent: list[str] | None = None
    tool: list[str] | None = None
    role: list[Literal["user", "agent", "system"]] | None = None
    detectors: list[str] | None = None
    arguments: list[ArgumentMatch] | None = None
    session: SessionMatch | None = None
    # Tool calls of tools labelled egress (policy `egress.tools`) only.
    egress: bool | None = None
    # Tool calls of consequential tools (they send, pay, delete, write or post: declared by
    # the tool, by the policy's `[[tools]]`, or an egress tool) only.
    consequential: bool | None = None


class Modify(_Strict, frozen=True):
    """What a `modify` rule does to the step's content."""

    # Detector id patterns whose findings are replaced.
    redact: list[str] = msgspec.field(default_factory=list)
    # placeholder: `<EMAIL_1>`, the same value the same placeholder within a session;
    # mask: `****`; replace: the `replacement` text.
    style: RedactStyle = "placeholder"
    replacement: str = "[REDACTED]"
    # Put the real values back for placeholders of these detectors (for an approved tool).
    restore: list[str] = msgspec.field(default_factory=list)
    # Replace only values that came in untrusted content (not ones the user gave).
    only_untrusted: bool = False


class Rule(_Strict, frozen=True):
    id: str
    action: Action
    reason_code: str
    match: Match = msgspec.field(default_factory=Match)
    message: str | None = None
    description: str | None = None
    modify: Modify | None = None
    enabled: bool = True


class Egress(_Strict, frozen=True):
    """Tools that send data out, and where they may send it."""

    tools: list[str] = msgspec.field(default_factory=list)
    allow_domains: list[str] | None = None
    deny_domains: list[str] = msgspec.field(default_factory=list)


Consequence = Literal["sends", "pays", "deletes", "writes", "posts"]


class ToolDeclaration(_Strict, frozen=True):
    """What the policy says of tools whose name matches `name` (`*` allowed): what a call
    does to the world, which arguments name its recipient or target, whether its output is
    the user's own trusted data. A tool's own declaration (agent API) is used where it gives
    one; the first matching declaration here fills in the rest."""

    name: str
    consequence: Consequence | None = None
    targets: list[str] = msgspec.field(default_factory=list)
    trusted_output: bool = False


class Limits(_Strict, frozen=True):
    """How much one step may make the guardian read.

    A step carrying more than `max_scan_bytes` of content (UTF-8, all its texts together) is
    not scanned: it gets `over_limit` (`deny` by default: fail closed) with reason code
    `limit.scan_bytes`. `allow` lets it through unscanned (still counted as untrusted input
    where it is one). A link in an agent's reply longer than `max_link_chars` is not decoded
    (`memory.scan_links`): the reply gets `over_limit` too, with reason code
    `limit.link_chars`."""

    max_scan_bytes: int = 1024 * 1024
    max_link_chars: int = 16 * 1024
    over_limit: Literal["allow", "deny"] = "deny"


class Policy(_Strict, frozen=True):
    version: Literal[1] = 1
    # A policy file extends the shipped default (its rules come first, its `[[tools]]` and
    # egress tools are added to), unless it says `extends = "none"`.
    extends: Literal["default", "none"] = "default"
    # Ids of rules of the extended policy to leave out (a rule with the same id as one of
    # them replaces it instead).
    disable: list[str] = msgspec.field(default_factory=list)
    tools: list[ToolDeclaration] = msgspec.field(default_factory=list)
    mode: Literal["enforce", "shadow"] = "enforce"
    default: Literal["allow", "deny"] = "allow"
    egress: Egress = msgspec.field(default_factory=Egress)
    limits: Limits = msgspec.field(default_factory=Limits)
    rules: list[Rule] = msgspec.field(default_factory=list)
    # Set by the loader: sha256 of the file's bytes, named in every verdict.
    hash: str = ""


def _check_names(where: str, field: str, patterns: list[str], known: list[str]) -> None:
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in known):
            raise PolicyError(
                f"{where}: {field}: {pattern!r} names no known detector (known: {', '.join(known)})"
            )


def validate(policy: Policy) -> Policy:
    """Cross-field checks msgspec's schema cannot express."""
    seen: set[str] = set()
    if policy.limits.max_scan_bytes < 1:
        raise PolicyError("limits.max_scan_bytes: must be at least 1")
    if policy.limits.max_link_chars < 1:
        raise PolicyError("limits.max_link_chars: must be at least 1")
    # Imported here: the CLI imports this module for `PolicyError` alone, and should not pay
    # for compiling every detector pattern unless a policy is actually checked.
    from aap_server.guardian.detectors import detector_ids

    detectors = [*detector_ids(), *STEP_FINDINGS]
    for index, rule in enumerate(policy.rules):
        where = f"rules[{index}] (id {rule.id!r})"
        if not rule.id.strip():
            raise PolicyError(f"rules[{index}].id: must not be empty")
        if rule.id in seen:
            raise PolicyError(f"{where}: id: duplicate rule id")
        seen.add(rule.id)
        if rule.action == "modify" and (
            rule.modify is None or not (rule.modify.redact or rule.modify.restore)
        ):
            raise PolicyError(f"{where}: modify: a modify rule needs `modify.redact` or `restore`")
        if rule.action != "modify" and rule.modify is not None:
            raise PolicyError(f"{where}: modify: only rules with action 'modify' may set it")
        for method in rule.match.method or []:
            if method not in AOS_METHODS:
                raise PolicyError(
                    f"{where}: match.method: unknown AOS method {method!r} "
                    f"(one of {', '.join(AOS_METHODS)})"
                )
        _check_names(where, "match.detectors", rule.match.detectors or [], detectors)
        if rule.modify is not None:
            _check_names(where, "modify.redact", rule.modify.redact, detectors)
            _check_names(where, "modify.restore", rule.modify.restore, detectors)
        for arg_index, argument in enumerate(rule.match.arguments or []):
            given = [
                argument.equals is not None,
                argument.contains is not None,
                argument.matches is not None,
                argument.exists is not None,
            ]
            if sum(given) != 1:
                raise PolicyError(
                    f"{where}: match.arguments[{arg_index}]: set exactly one of "
                    "equals, contains, matches, exists"
                )
            if argument.matches is not None:
                try:
                    re.compile(argument.matches)
                except re.error as error:
                    raise PolicyError(
                        f"{where}: match.arguments[{arg_index}].matches: bad regex: {error}"
                    ) from error
    return policy


def parse_policy(data: bytes, source: str = "policy") -> Policy:
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise PolicyError(f"{source}: not valid TOML: {error}") from error
    try:
        policy = msgspec.convert(raw, Policy)
    except msgspec.ValidationError as error:
        raise PolicyError(f"{source}: {_name_rule(raw, str(error))}") from error
    try:
        policy = validate(policy)
    except PolicyError as error:
        raise PolicyError(f"{source}: {error}") from error
    return msgspec.structs.replace(policy, hash=hashlib.sha256(data).hexdigest())


def _name_rule(raw: dict[str, Any], message: str) -> str:
    """msgspec says `... - at `$.rules[2].action``: add the rule's id to it."""
    found = re.search(r"\$\.rules\[(\d+)\]", message)
    rules = raw.get("rules")
    if found and isinstance(rules, list) and int(found.group(1)) < len(rules):
        rule = rules[int(found.group(1))]
        if isinstance(rule, dict) and "id" in rule:
            return f"{message} (rule id {rule['id']!r})"
    return message


def load_policy(path: str | Path) -> Policy:
    """A policy file, on top of the shipped default unless it says `extends = "none"`."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as error:
        raise PolicyError(f"{file}: cannot be read: {error.strerror}") from error
    policy = parse_policy(data, str(file))
    if policy.extends == "none":
        return policy
    return extend(default_policy(), policy, str(file))


def extend(base: Policy, policy: Policy, source: str = "policy") -> Policy:
    """`policy` on top of `base`: base's rules first (less those `policy` disables or
    replaces by id), then policy's; tool declarations and egress tools added to (policy's
    first, so they win); policy's mode, default, limits and domain lists."""
    unknown = sorted(set(policy.disable) - {rule.id for rule in base.rules})
    if unknown:
        raise PolicyError(f"{source}: disable: no rule of the default policy has id {unknown[0]!r}")
    replaced = {rule.id for rule in policy.rules} | set(policy.disable)
    egress = msgspec.structs.replace(
        policy.egress, tools=[*policy.egress.tools, *base.egress.tools]
    )
    merged = msgspec.structs.replace(
        policy,
        extends="none",
        egress=egress,
        tools=[*policy.tools, *base.tools],
        rules=[*(r for r in base.rules if r.id not in replaced), *policy.rules],
        hash=hashlib.sha256(f"{base.hash}+{policy.hash}".encode()).hexdigest(),
    )
    return validate(merged)


DEFAULT_POLICY_PATH = Path(__file__).with_name("default_policy.toml")


def default_policy() -> Policy:
    """The policy that ships: protects a new user without configuration."""
    return parse_policy(DEFAULT_POLICY_PATH.read_bytes(), str(DEFAULT_POLICY_PATH))
