"""PII detectors as issue 8 asks for them: every card brand's prefixes and lengths (Luhn),
IBANs however grouped, phone numbers validated per region with `phonenumbers` and written as
that region writes them, IDNA e-mail domains."""

from __future__ import annotations

import pytest

from aap_server.guardian.detectors import scan_all
from tests.guardian.detectors.fakes import Fakes

FAKE = Fakes(seed=11)


def found(text: str, detector: str) -> list[str]:
    return [f.value for f in scan_all(text) if f.detector == detector]


@pytest.mark.parametrize(
    ("prefix", "length", "brand"),
    [
        ("1", 15, "UATP"),
        ("1800", 15, "JCB 15-digit"),
        ("2131", 15, "JCB 15-digit"),
        ("5019", 16, "Dankort"),
        ("2200", 16, "Mir"),
        ("6759", 16, "Maestro UK"),
        ("9792", 16, "Troy"),
        ("8600", 16, "UzCard"),
        ("60", 19, "RuPay / Hipercard"),
        ("5018", 12, "Maestro 12-digit"),
    ],
)
def test_every_brand_prefix_and_length_is_a_card(prefix: str, length: int, brand: str) -> None:
    card = FAKE.card(prefix, length)
    assert found(f"payment card {card} on file", "pii.card") == [card], brand


def test_a_brand_length_it_does_not_issue_or_a_bad_luhn_digit_is_not_a_card() -> None:
    assert found(f"card {FAKE.card('34', 16)}", "pii.card") == []  # Amex is 15 digits
    assert found(f"card {FAKE.card('1', 16)}", "pii.card") == []  # UATP is 15 digits
    assert found(f"card {FAKE.card_bad_luhn('1', 15)}", "pii.card") == []


def test_a_bare_twelve_digit_run_is_a_card_only_where_the_text_says_card() -> None:
    maestro = FAKE.card("5018", 12)
    assert found(f"order {maestro} shipped", "pii.card") == []
    assert found(f"Maestro {maestro}", "pii.card") == [maestro]


def test_an_iban_grouped_with_dashes_is_an_iban() -> None:
    iban = FAKE.group(FAKE.iban("DE", "370400440532013000"), sep="-")
    assert found(f"IBAN {iban}.", "pii.iban") == [iban]


def test_an_address_at_an_idna_domain_is_an_email() -> None:
    assert found("write to a@xn--d1acufc.xn--p1ai", "pii.email") == ["a@xn--d1acufc.xn--p1ai"]


@pytest.mark.parametrize(
    "number",
    [
        "+86 139 1234 5678",
        "+972-9-762-5400",
        "+34 612 34 56 78",
        "+7 (495) 123-45-67",
        "+31 6 12345678",
        "03-1234-5678",  # Tokyo, as Japan writes it
        "089 1234567",  # Munich
        "07700 900123",  # a UK mobile
        "02 9876 5432",  # Sydney
    ],
)
def test_phone_numbers_valid_in_their_region_and_written_its_way_are_found(number: str) -> None:
    assert found(f"office {number} today", "pii.phone") == [number]


@pytest.mark.parametrize(
    ("cue", "number"),
    [("My number is", "13912345678"), ("Handy:", "0151 23456789"), ("mobile:", "98765 43210")],
)
def test_a_bare_or_loosely_grouped_number_is_a_phone_where_the_text_says_so(
    cue: str, number: str
) -> None:
    assert found(f"{cue} {number}", "pii.phone") == [number]
    assert found(f"total {number}", "pii.phone") == []


@pytest.mark.parametrize(
    "text",
    [
        "order number 13912345678",  # named as something else
        "card number is 36168002586008",
        "SKU 4400-1234-5678",  # valid in Germany's plan, but not written as a number there
        "ticket 0417 1643 01",
        "Score 123 45 6789 points",  # Japan writes the trunk 0
        "model XR-2045-1180",  # the digits of a code
        "BE71 0961 2345 6760",  # the tail of a grouped code (an IBAN failing its check)
        "ref 693-09.4444",  # dots mixed with dashes
        "Call ID 555-0100-2231-9",
        "server at 10.20.30.40 is down",
        "zip 94103-1234",
    ],
)
def test_digit_groups_that_are_not_written_as_phone_numbers_are_not_phones(text: str) -> None:
    assert found(text, "pii.phone") == []


def test_a_number_after_a_zip_code_is_found_but_the_tail_of_a_grouped_code_is_not() -> None:
    assert found("Pizza, Bamblee, SD 20241 440-600-5124", "pii.phone") == ["440-600-5124"]
    assert found("USPS tracking 9400 1000 0000 0000 0000 00", "pii.phone") == []
    assert found("Order #112-4567890-1234567 shipped", "pii.phone") == []


def test_past_the_check_budget_phone_shaped_runs_count_as_phones() -> None:
    # Digit groups no number plan writes that way: checked (and rejected) up to the budget,
    # reported past it, so thousands of decoys neither cost seconds nor hide a number.
    from aap_server.guardian.detectors.pii import MAX_PHONE_CHECKS

    decoys = [f"0417 {1000 + n} {10 + n % 90:02d}" for n in range(MAX_PHONE_CHECKS + 40)]
    text = "; ".join(f"ref {decoy}" for decoy in decoys)
    assert len(found(text, "pii.phone")) == 40
    within = "; ".join(f"ref {decoy}" for decoy in decoys[:MAX_PHONE_CHECKS])
    assert found(within, "pii.phone") == []


def test_amounts_no_region_writes_take_none_of_the_check_budget() -> None:
    # A JSON tool result of amounts (`123300.0`: a last group of one digit, which no number
    # plan ends with) needs no check: past the budget they are not reported as phones, and
    # a real number after them is still checked.
    from aap_server.guardian.detectors.pii import MAX_PHONE_CHECKS

    rows = ",".join(f'{{"total":{123300 + n}.0}}' for n in range(MAX_PHONE_CHECKS + 40))
    assert found(f"[{rows}]", "pii.phone") == []
    assert found(f"[{rows}] call (415) 555-0132", "pii.phone") == ["(415) 555-0132"]
