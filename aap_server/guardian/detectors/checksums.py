"""Check digits and checksums of the formats the detectors verify (all public algorithms)."""

from __future__ import annotations

import zlib

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_LUHN_DOUBLE = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)
_IBAN_DIGITS = {ord(ch): str(10 + i) for i, ch in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZ")}

# ISO 13616 IBAN lengths per country (SWIFT IBAN registry).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24,
    "DE": 22, "DJ": 27, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18,
    "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27,
    "GT": 28, "HN": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20,
    "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20,
    "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25,
    "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
    "YE": 30,
}  # fmt: skip


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check used by payment card numbers."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = ord(ch) - 48
        total += _LUHN_DOUBLE[n] if i & 1 else n
    return total % 10 == 0


def iban_valid(compact: str) -> bool:
    """Country, length and the ISO 7064 mod-97 check of an IBAN without spaces."""
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact.isalnum():
        return False
    return int((compact[4:] + compact[:4]).translate(_IBAN_DIGITS)) % 97 == 1


def base62(number: int, width: int) -> str:
    """`number` in base 62 (digits, upper, lower), left-padded with `0` to `width`."""
    out = []
    while number:
        number, rem = divmod(number, 62)
        out.append(BASE62[rem])
    return "".join(reversed(out)).rjust(width, "0")


def crc32_base62_valid(body: str) -> bool:
    """GitHub (`ghp_` …) and npm (`npm_`) tokens: 30 random base62 characters followed by the
    CRC32 of those characters in 6 base62 digits (GitHub blog, 2021-04-05; npm, 2021-09-23)."""
    if len(body) != 36:
        return False
    return base62(zlib.crc32(body[:30].encode("ascii")), 6) == body[30:]


_BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_BECH32_GEN = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)


def _bech32_polymod(values: list[int]) -> int:
    chk = 1
    for value in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ value
        for i, gen in enumerate(_BECH32_GEN):
            if (top >> i) & 1:
                chk ^= gen
    return chk


def bech32_valid(text: str) -> bool:
    """A BIP-173 bech32 string (used by `age` secret keys) with a correct checksum."""
    text = text.lower()
    sep = text.rfind("1")
    if sep < 1 or len(text) - sep < 7:
        return False
    hrp, data = text[:sep], text[sep + 1 :]
    values = [_BECH32.find(ch) for ch in data]
    if min(values) < 0:
        return False
    expanded = [ord(ch) >> 5 for ch in hrp] + [0] + [ord(ch) & 31 for ch in hrp]
    return _bech32_polymod(expanded + values) == 1
