"""Generators of FAKE values in real formats, with valid check digits where a format has them.

Nothing here is a real credential or a real person's data: every value is drawn from a seeded
random generator at import time (so no token-shaped literal sits in the source for secret
scanners to trip on), and the checksums are computed with implementations written here,
independently of the package under test.
"""

from __future__ import annotations

import base64
import json
import random
import string
import zlib

BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


class Fakes:
    """A seeded source of fake values (same seed, same values)."""

    def __init__(self, seed: int = 20240501) -> None:
        self.rng = random.Random(seed)

    # --- plain random strings -------------------------------------------------------------

    def chars(self, alphabet: str, n: int) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def alnum(self, n: int) -> str:
        """Random base62; from 8 characters on, with two digits and both cases (so that it
        reads as random)."""
        if n < 8:
            return self.chars(ALNUM, n)
        while True:
            value = self.chars(ALNUM, n)
            if (
                sum(ch.isdigit() for ch in value) >= 2
                and any(ch.isupper() for ch in value)
                and any(ch.islower() for ch in value)
            ):
                return value

    def hex(self, n: int) -> str:
        return self.chars(HEX, n)

    def b64url(self, n: int) -> str:
        return self.chars(ALNUM + "-_", n)

    def b64(self, n: int) -> str:
        return self.chars(ALNUM + "+/", n)

    # --- checksummed tokens ---------------------------------------------------------------

    @staticmethod
    def _base62(number: int) -> str:
        out = ""
        while number:
            number, rem = divmod(number, 62)
            out = BASE62[rem] + out
        return out.rjust(6, "0")

    def crc_token(self, prefix: str) -> str:
        """GitHub/npm style: 30 random base62 characters + CRC32 of them in 6 base62 digits."""
        body = self.alnum(30)
        return prefix + body + self._base62(zlib.crc32(body.encode()))

    def crc_token_bad_checksum(self, prefix: str) -> str:
        token = self.crc_token(prefix)
        last = token[-1]
        return token[:-1] + ("A" if last != "A" else "B")

    def jwt(self, claims: dict[str, object] | None = None) -> str:
        def enc(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        header = enc(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        payload = enc(json.dumps(claims or {"sub": "user-42", "iat": 1716239022}).encode())
        return f"{header}.{payload}.{self.b64url(43)}"

    def age_key(self) -> str:
        charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
        hrp = "age-secret-key-"
        data = [self.rng.randrange(32) for _ in range(52)]

        def polymod(values: list[int]) -> int:
            gen = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
            chk = 1
            for value in values:
                top = chk >> 25
                chk = (chk & 0x1FFFFFF) << 5 ^ value
                for i in range(5):
                    chk ^= gen[i] if (top >> i) & 1 else 0
            return chk

        expanded = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
        mod = polymod([*expanded, *data, 0, 0, 0, 0, 0, 0]) ^ 1
        checksum = [(mod >> 5 * (5 - i)) & 31 for i in range(6)]
        return (hrp + "1" + "".join(charset[d] for d in data + checksum)).upper()

    # --- PII ------------------------------------------------------------------------------

    @staticmethod
    def luhn_complete(partial: str) -> str:
        """Append the Luhn check digit."""
        total = 0
        for i, ch in enumerate(reversed(partial)):
            n = int(ch)
            if i % 2 == 0:
                n *= 2
                if n > 9:
                    n -= 9
            total += n
        return partial + str((10 - total % 10) % 10)

    def card(self, prefix: str, length: int) -> str:
        return self.luhn_complete(prefix + self.chars(string.digits, length - len(prefix) - 1))

    def card_bad_luhn(self, prefix: str, length: int) -> str:
        card = self.card(prefix, length)
        return card[:-1] + str((int(card[-1]) + 1) % 10)

    def iban(self, country: str, bban: str) -> str:
        rearranged = bban + country + "00"
        number = int("".join(str(int(ch, 36)) for ch in rearranged))
        return f"{country}{98 - number % 97:02d}{bban}"

    def ssn(self) -> str:
        area = self.rng.choice([n for n in range(1, 900) if n != 666])
        return f"{area:03d}-{self.rng.randrange(1, 100):02d}-{self.rng.randrange(1, 10000):04d}"

    @staticmethod
    def group(value: str, size: int = 4, sep: str = " ") -> str:
        return sep.join(value[i : i + size] for i in range(0, len(value), size))
