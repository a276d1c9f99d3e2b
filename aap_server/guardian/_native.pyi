"""The guardian's hot primitives in C (`_native.c`); selected by `aap_server.guardian.native`.
None from a function: its hash set met too many collisions (the caller runs Python)."""

from collections.abc import Sequence

def fingerprints(chunks: Sequence[bytes | bytearray | memoryview], /) -> list[int]:
    """`fingerprints.fingerprint` of each chunk, in order."""

def parts_prints(text: str, /) -> list[int] | None:
    """`provenance._parts_prints` of ASCII text: its distinct fingerprints (ValueError for
    other text)."""

def distinct_runs(data: bytes, table: bytes, delete: bytes = b"", /) -> set[bytes] | None:
    """`set(data.translate(table, delete).split())`."""

def distinct_words(text: str, /) -> set[str] | None:
    """`set(text.split())` of ASCII text (ValueError for other text)."""

def amount_prints(text: str, /) -> list[int] | None:
    """`provenance._amount_prints` of ASCII text without an apostrophe (which may be a group
    mark): its distinct fingerprints (ValueError for other text)."""

def merge_prints(prints: dict[int, int], values: list[int], epoch: int, /) -> tuple[int, bool]:
    """The dict work of `fingerprints.Prints.add_all`: each value moved to (or put at) the
    end of `prints`, mapped to `epoch`, in order; (how many distinct values were not mapped
    to `epoch` already, whether any was new)."""
