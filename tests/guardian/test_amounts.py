"""Provenance reads amounts however they are spelled (issue 8, harm stopped when the model is
fooled): a number an untrusted mail spells with a currency, separators, a key or escapes is
still the mail's number, the user's own amount spelled otherwise is still the user's, and a
date, a version or an address does not become an amount. (The attacks themselves are in
`test_review_r7.py`: `test_an_amount_the_mail_spelled_otherwise_still_asks_first`.)"""

from __future__ import annotations

import pytest

from aap_server.guardian.provenance import _print, words_of
from tests.conftest import best_cpu_seconds
from tests.guardian.test_review_r7 import USERS_IBAN, _after_untrusted_mail, _call


def _spells(text: str, number: str) -> bool:
    return _print(number) in words_of(text, values_only=True)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("total: USD 12,345.50 due", "12345.5"),
        ("total 12.345,50 € due", "12345.5"),
        ("GBP1,000,000 wired", "1000000"),
        ("price=0,50 chf", "0.5"),
        ("Betrag: 9\u202f731 CHF", "9731"),
        ("paid \u00a39731.00 today", "9731"),
        ("\u0669\u0667\u0663\u0661 \u062f\u0631\u0647\u0645", "9731"),  # Arabic-Indic digits
    ],
)
def test_the_number_a_text_spells_is_learned(text: str, number: str) -> None:
    assert _spells(text, number)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("released 2024-05-01 as v2.4.10", "2024"),
        ("released 2024-05-01 as v2.4.10", "2410"),
        ("meet on 01.05.2024 at 10:30", "1052024"),
        ("meet on 05/01/2024", "2024"),
        ("server 192.168.100.1 is up", "192168"),
        ("call 555.123.4567 now", "5551234567"),
        ("sha256 of build ab1234cd", "256"),
        ("pay 3 100 dollar coins", "3100"),  # a plain space groups nothing
    ],
)
def test_a_date_a_version_or_an_address_spells_no_amount(text: str, number: str) -> None:
    assert not _spells(text, number)


@pytest.mark.parametrize(
    ("user", "mail"),
    [
        (f"Pay my landlord {USERS_IBAN} $9,731 for the rent", "The rent is 9731 this month."),
        (f"Pay my landlord {USERS_IBAN} 9.731,00 EUR", "Die Miete ist jetzt 9.731,00 EUR."),
        (f"Pay my landlord {USERS_IBAN} 9731 EUR", "rent:9731 due 2024-05-01 (portal v2.4.10)"),
    ],
)
@pytest.mark.parametrize("amount", [9731, "9731 EUR", "$9,731.00"])
async def test_the_users_amount_spelled_otherwise_is_still_the_users(
    user: str, mail: str, amount: object
) -> None:
    guardian, make = await _after_untrusted_mail(user, mail)
    arguments = {"recipient": USERS_IBAN, "amount": amount, "subject": "rent"}
    assert await _call(guardian, make, "send_money", arguments) == "allow"


@pytest.mark.parametrize("amount", ["9.731,00 EUR", "EUR 9,731.00", "\u20ac\u00a09731"])
async def test_the_mails_amount_with_a_currency_in_the_call_asks_first(amount: str) -> None:
    guardian, make = await _after_untrusted_mail(
        f"Pay my landlord {USERS_IBAN} the rent please", "The rent is now 9,731 this month."
    )
    arguments = {"recipient": USERS_IBAN, "amount": amount, "subject": "rent"}
    assert await _call(guardian, make, "send_money", arguments) == "require_approval"


async def test_a_date_in_the_mail_does_not_make_the_users_call_ask() -> None:
    """The mail's date and version yield no number the user's call could be taken for."""
    guardian, make = await _after_untrusted_mail(
        f"Pay my landlord {USERS_IBAN} the rent of 950",
        "Rent due 2024-05-01, portal v2.4.10, ref 01.05.2024.",
    )
    arguments = {"recipient": USERS_IBAN, "amount": 950, "subject": "rent", "year": "2024"}
    assert await _call(guardian, make, "send_money", arguments) == "allow"


@pytest.mark.parametrize(
    "unit",
    ["$1,0", "eur1", "1,", "1\u00a0", "=1.", "a:1,000", "1" * 50 + "-", "\uff11,"],
)
@pytest.mark.parametrize("values_only", [True, False])
def test_reading_amounts_is_linear_in_the_text(unit: str, values_only: bool) -> None:
    small, large = unit * (100_000 // len(unit)), unit * (1_000_000 // len(unit))
    ratio = best_cpu_seconds(lambda: words_of(large, values_only)) / max(
        best_cpu_seconds(lambda: words_of(small, values_only)), 1e-4
    )
    assert ratio < 25, (unit, ratio)
