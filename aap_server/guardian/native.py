"""Which implementation of the guardian's hot primitives runs: the C extension
`aap_server.guardian._native` (built from `_native.c` when the package is installed with a C
compiler at hand: `pip install`, the Docker image's build stage), or the pure-Python code it
stands for, which stays the reference and the fallback.

`NATIVE` is the extension when it was built and `AAP_GUARDIAN_PURE_PYTHON` is not set to a
non-empty value, else None, chosen at import; the callers (`fingerprints`, `provenance`, the
detectors) look at it on each call, so the two give the same results in the same process
(tests/guardian/test_native.py compares them). `BUILT` says whether the extension is
installed at all, `active()` which one runs ("C extension" or "pure Python")."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol


class Primitives(Protocol):
    """What `_native` provides (see `_native.pyi`). None from a function: its hash set met
    too many collisions (made by the text, or by chance), and the caller runs Python."""

    def fingerprints(self, chunks: Sequence[bytes], /) -> list[int]: ...

    def parts_prints(self, text: str, /) -> list[int] | None: ...

    def distinct_runs(
        self, data: bytes, table: bytes, delete: bytes = b"", /
    ) -> set[bytes] | None: ...

    def distinct_words(self, text: str, /) -> set[str] | None: ...

    def amount_prints(self, text: str, /) -> list[int] | None: ...

    def merge_prints(
        self, prints: dict[int, int], values: list[int], epoch: int, /
    ) -> tuple[int, bool]: ...


def _built() -> Primitives | None:
    try:
        from aap_server.guardian import _native
    except ImportError:  # (installed without a compiler: the pure-Python code runs)
        return None
    return _native


_EXTENSION = _built()
BUILT = _EXTENSION is not None
NATIVE: Primitives | None = None if os.environ.get("AAP_GUARDIAN_PURE_PYTHON") else _EXTENSION


def active() -> str:
    """Which implementation runs."""
    return "C extension" if NATIVE is not None else "pure Python"
