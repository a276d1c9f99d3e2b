"""Streaming agent text: how much must be held back follows from the policy in force.

`screen_for(policy)` looks at every enabled rule that can act on an agent's `steps/message`:

- a `modify` rule whose rewrite only touches secret or PII findings (`modify.redact` of
  `secret.*` / `pii.*` detectors, no `restore`) is *windowed*: its changes are confined to
  short spans, so text is released behind a bounded window (`WindowScreen`);
- any other rule that can refuse or change agent text (a `deny` or `modify` on anything else:
  injection detectors, session conditions, argument conditions, restore), or a `default =
  "deny"` that no unconditional rule overrides, needs the *whole message*: nothing is sent
  before the message check (`HoldMessage`);
- no such rule (or `mode = "shadow"`, which never changes anything): deltas pass at once.

So a delta never carries text that the message check then refuses or rewrites. A policy
reload applies to messages started after it.

`WindowScreen` is incremental: each character is scanned a bounded number of times however
the text is split into deltas. The newest `window` characters are always held (so a secret or
an e-mail split across deltas is seen whole), a release never cuts a run of non-space
characters (a long token is held until it ends), scanning waits until at least `window` new
characters can be released, and nothing from the first finding (or `-----BEGIN`) on is
released: that text waits for the whole-message check. Added latency: the window plus the
token being written.
"""

from __future__ import annotations

from collections.abc import Callable

from aap_server.guardian.base import HoldMessage, PassThrough, TextScreen
from aap_server.guardian.detectors import Category
from aap_server.guardian.detectors._views import TextViews
from aap_server.guardian.detectors.pii import scan_pii_views
from aap_server.guardian.detectors.secret_formats import scan_secrets_views
from aap_server.guardian.memory import may_hold_links, scan_links
from aap_server.guardian.policy import Limits, Match, Policy, Rule

WINDOW = 64
SCREENED: tuple[Category, ...] = ("secret", "pii")
# Already released text looked at again as the context of what follows (a detector may look
# this far back: `SSN` before a number, a secret's name before its value).
LOOKBEHIND = 64
# The openings of multi-line secrets, held from where they start until the message check.
_OPENINGS = ("-----BEGIN",)
_WINDOWED_CATEGORIES = {"secret": scan_secrets_views, "pii": scan_pii_views}


class WindowScreen(TextScreen):
    def __init__(
        self,
        window: int = WINDOW,
        categories: tuple[Category, ...] = SCREENED,
        max_link_chars: int = Limits().max_link_chars,
    ) -> None:
        self.window = window
        self.max_link_chars = max_link_chars
        self.scanners = [_WINDOWED_CATEGORIES[c] for c in categories if c in _WINDOWED_CATEGORIES]
        # The text from `_base` on (the last LOOKBEHIND released characters and all held
        # ones); deltas not yet joined wait in `_pieces`, so a delta costs O(its length).
        self._tail = ""
        self._base = 0
        self._pieces: list[str] = []
        self._length = 0
        self._released = 0
        # Where a release may cut: the last whitespace at or before `_searched` (the newest
        # limit looked at; -1: none). Each feed searches only the text the limit passed since
        # (in `_recent`, the last `window` characters fed, and the delta): every character is
        # searched once, in C, with no Python step per space.
        self._last_space = -1
        self._searched = -1
        self._recent = ""
        # Once a finding is held, everything after it waits for the message check.
        self._stopped = False
        self.scanned_chars = 0  # work done, for tests and benchmarks

    def feed(self, delta: str) -> str:
        if not delta or self._stopped:
            self._pieces.append(delta)
            self._length += len(delta)
            return ""
        offset = self._length
        self._pieces.append(delta)
        self._length = length = offset + len(delta)
        window = self.window
        limit = length - window
        recent = self._recent + delta  # the text from `start` on
        start = offset - len(self._recent)
        self._recent = recent[len(recent) - window :] if len(recent) > window else recent
        reach = min(limit, length - 1)  # (a window of 0 lets the limit pass the end)
        if reach > self._searched:
            # The last whitespace the limit passed since the last feed (never split a token).
            low, high = self._searched + 1 - start, reach + 1 - start
            at = max(
                recent.rfind(" ", low, high),
                recent.rfind("\n", low, high),
                recent.rfind("\t", low, high),
                recent.rfind("\r", low, high),
            )
            if at != -1:
                self._last_space = at + start
            self._searched = reach
        space = self._last_space
        if space < self._released or space + 1 - self._released < window:
            return ""
        cut = space + 1
        text = self._joined()
        stop = self._first_hold(text, cut)
        if stop is not None:
            cut = stop
            self._stopped = True
        released = text[self._released - self._base : cut - self._base]
        self._released = cut
        keep = max(self._base, cut - LOOKBEHIND)
        self._tail, self._base = text[keep - self._base :], keep
        return released

    def _joined(self) -> str:
        if self._pieces:
            self._tail += "".join(self._pieces)
            self._pieces = []
        return self._tail

    def _first_hold(self, text: str, cut: int) -> int | None:
        """Where the first finding or secret opening at or after the released mark starts
        (absolute), if before `cut`. `text` is the tail, starting at `_base`."""
        base, released = self._base, self._released
        first: int | None = None
        for opening in _OPENINGS:
            at = text.find(opening, released - base)
            if at != -1 and at + base < cut:
                first = at + base
        views = TextViews(text)
        self.scanned_chars += len(text)
        for scan in self.scanners:
            for finding in scan(views):
                start, end = finding.start + base, finding.end + base
                if end > released and start < cut:
                    start = max(start, released)
                    first = start if first is None else min(first, start)
        region = text[released - base : cut - base]
        if may_hold_links(region):  # what the message check finds encoded in links (`scan_links`)
            # (A release never cuts a token: each link is decoded once, whole.)
            links = scan_links(region, self.max_link_chars)
            starts = [f.start for f in links.findings]
            if links.too_long_at is not None:
                starts.append(links.too_long_at)
            if starts:
                at = min(starts) + released
                first = at if first is None else min(first, at)
        return first

    def close(self) -> str:
        """The text ends here: no window need wait for what follows, so everything up to the
        first finding (or secret opening) is released; from there on, held for the check."""
        if self._stopped:
            return ""
        text = self._joined()
        cut = self._length
        stop = self._first_hold(text, cut)
        if stop is not None:
            cut = stop
        self._stopped = True  # nothing more is released before the message check
        released = text[self._released - self._base : cut - self._base]
        self._released = cut
        return released

    def flush(self) -> str:
        text = self._joined()
        held = text[self._released - self._base :]
        self._released = self._length
        self._tail, self._base = "", self._length
        return held


def _can_reach_agent_text(match: Match) -> bool:
    """Whether a rule's match can hold for an agent's `steps/message` (the facts a message
    step has: method, role, no tool, no arguments)."""
    if match.method is not None and "steps/message" not in match.method:
        return False
    if match.role is not None and "agent" not in match.role:
        return False
    if match.tool is not None or match.egress is True:
        return False
    return all(condition.exists is False for condition in match.arguments or [])


def _unconditional(rule: Rule) -> bool:
    """Whether the rule matches every agent message whatever its text and the session."""
    match = rule.match
    return (
        _can_reach_agent_text(match)
        and match.agent is None
        and match.detectors is None
        and match.session is None
    )


def _windowed_categories(rule: Rule) -> tuple[Category, ...] | None:
    """The detector families whose spans hold all a `modify` rule can change, or None if it
    may change text anywhere (or is not a modify rule)."""
    modify = rule.modify
    if rule.action != "modify" or modify is None or modify.restore:
        return None
    found: set[str] = set()
    for pattern in modify.redact:
        family = pattern.split(".", 1)[0]
        if family not in SCREENED:
            return None  # `*`, `injection.*`, ...: not confined to short spans
        found.add(family)
    return tuple(c for c in SCREENED if c in found)


def screen_for(policy: Policy) -> Callable[[], TextScreen]:
    """A maker of one text screen per streamed message, as the policy requires."""
    if policy.mode == "shadow":
        return PassThrough
    rules = [r for r in policy.rules if r.enabled and _can_reach_agent_text(r.match)]
    if policy.default == "deny" and not any(
        _unconditional(r) and r.action in ("allow", "require_approval", "modify") for r in rules
    ):
        return HoldMessage
    categories: set[Category] = set()
    for rule in rules:
        if rule.action in ("allow", "require_approval"):
            continue  # neither refuses nor changes agent text (modifications come from modify)
        windowed = _windowed_categories(rule)
        if windowed is None:
            return HoldMessage
        categories.update(windowed)
    if not categories:
        return PassThrough
    chosen = tuple(c for c in SCREENED if c in categories)
    max_link_chars = policy.limits.max_link_chars
    return lambda: WindowScreen(categories=chosen, max_link_chars=max_link_chars)
