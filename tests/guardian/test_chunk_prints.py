"""The fingerprints kept of untrusted and confidential text: few per step (one hash per
`CHUNK_STRIDE` letters and digits, not one per character), still recognising any 31 letters
and digits of it in a row, and memory stored by the earlier (winnowing) version still read."""

from __future__ import annotations

import re
import types
import zlib
from pathlib import Path

import pytest

from aap_server.guardian import fingerprints as fingerprints_module
from aap_server.guardian import memory as guardian_memory
from aap_server.guardian import native, provenance
from aap_server.guardian.fingerprints import Prints
from aap_server.guardian.policy import default_policy, parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from tests.guardian.test_memory_log import READS_UNTRUSTED_LINES
from tests.guardian.test_policy import steps
from tests.guardian.test_session_memory import LONG_NOTE

# What `PolicyGuardian.export_session` gave, before chunks were kept at a stride, after the
# knowledge retrieval of LONG_NOTE (winnowed chunk hashes).
WINNOWED_EXPORT = Path(__file__).with_name("memory_winnowed_export.json")
# The run of letters and digits a kept chunk hash is guaranteed to be found in.
GUARANTEED_RUN = guardian_memory.CHUNK_CHARS + guardian_memory.CHUNK_STRIDE - 1


@pytest.fixture
def hashes_taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the fingerprints taken (every one is a `zlib.crc32` of the pure-Python path,
    which runs for this: the C extension's hashes are not seen from Python)."""
    count = [0]
    monkeypatch.setattr(native, "NATIVE", None)

    def counted_crc32(data: bytes, value: int = 0) -> int:
        count[0] += 1
        return zlib.crc32(data, value)

    counting = types.SimpleNamespace(crc32=counted_crc32, adler32=zlib.adler32)
    monkeypatch.setattr(fingerprints_module, "zlib", counting)
    return count


def test_fingerprints_are_the_fingerprint_of_each_chunk() -> None:
    chunks = [b"", b"a", "café über".encode(), bytes(range(256))]
    found = list(fingerprints_module.fingerprints(chunks))
    assert found == [fingerprints_module.fingerprint(c) for c in chunks]


def test_a_text_costs_one_hash_per_stride(hashes_taken: list[int]) -> None:
    flat_length = len(re.sub(r"[\W_]+", "", LONG_NOTE))
    prints = guardian_memory.chunk_prints(LONG_NOTE * 40)
    # One hash per CHUNK_STRIDE letters and digits (and the last chunk), not one per position.
    limit = 40 * flat_length // guardian_memory.CHUNK_STRIDE + 1
    assert 0 < len(prints) <= hashes_taken[0] <= limit


NON_ASCII_NOTE = (
    "Réunion à 10 h : le plan Q3 de l'équipe — Café Müller, Zürich; данные плана 2024, "
    "Ωμέγα budget 1\u00a0200\u00a0000 EUR"
)


@pytest.mark.parametrize("note", [LONG_NOTE, NON_ASCII_NOTE])
def test_every_guaranteed_run_of_a_tracked_text_is_recognised(note: str) -> None:
    tracked = Prints(guardian_memory.MAX_LINE_PRINTS)
    tracked.add_all(guardian_memory.chunk_prints(note))
    flat = re.sub(r"[\W_]+", "", note.lower())
    for start in range(len(flat) - GUARANTEED_RUN + 1):
        # Upper-cased and spaced out, inside other text: still the same letters and digits.
        run = " ".join(flat[start : start + GUARANTEED_RUN].upper())
        forms = [f"see: {run} thanks".lower().encode()]
        assert tracked.meets(guardian_memory.window_prints(forms)), (start, run)


async def test_memory_stored_by_the_winnowing_version_still_recognises_its_text() -> None:
    guardian = PolicyGuardian(default_policy())
    guardian.import_session("sess_1", [WINNOWED_EXPORT.read_bytes()])
    fragment = "fyi: alice martin ENGINEERING   lead earns 182,000"
    leak = steps(turn="turn_2").tool_call_request(
        "c9", "send_email", {"to": "x@example.com", "body": fragment}
    )
    assert (await guardian.check(leak)).decision == "deny"
    unrelated = "The weather is fine today and nothing happened at all."
    clean = steps(turn="turn_3").tool_call_request("c10", "post_it", {"body": unrelated})
    assert (await guardian.check(clean)).decision == "allow"


def _prose(size: int, seed: int) -> str:
    words = "the quick brown fox jumps over the lazy dog while the team reviews the plan "
    return "".join(f"{words}{seed + i}. " for i in range(size // len(words) + 1))[:size]


async def test_a_steps_hashing_does_not_depend_on_the_sessions_past(
    hashes_taken: list[int],
) -> None:
    taken = []
    for past in (1, 200):
        # A rule that reads untrusted lines: the result's chunks are hashed.
        guardian = PolicyGuardian(parse_policy(READS_UNTRUSTED_LINES))
        for turn in range(past):
            result = steps(turn=f"turn_{turn}").tool_call_result("c1", _prose(4096, turn), False)
            await guardian.check(result)
        provenance._kept_token_prints.cache_clear()  # words seen before are not hashed again
        hashes_taken[0] = 0
        last = steps(turn="turn_last").tool_call_result("c2", _prose(4096, 10**6), False)
        await guardian.check(last)
        taken.append(hashes_taken[0])
    assert taken[0] == taken[1]


def test_argument_hashing_is_linear(hashes_taken: list[int]) -> None:
    taken = []
    for size in (100_000, 1_000_000):
        hashes_taken[0] = 0
        guardian_memory.window_prints([_prose(size, 0).encode()])
        taken.append(hashes_taken[0])
    # Two hashes per offset (a line's first bytes, a chunk): 10 x the text, 10 x the hashes.
    assert 9.5 < taken[1] / taken[0] < 10.5


def _naive_chunks(text: str, step: int) -> list[int]:
    """`_chunks_at` by its definition, one slice and one `fingerprint` at a time."""
    flat = re.sub(r"[\W_]+", "", text.lower())
    last = len(flat) - guardian_memory.CHUNK_CHARS
    if last < 0:
        return []
    starts = [*range(0, last, step), last]
    return [
        fingerprints_module.fingerprint(flat[s : s + guardian_memory.CHUNK_CHARS].encode())
        for s in starts
    ]


@pytest.mark.parametrize("note", [LONG_NOTE, NON_ASCII_NOTE])
def test_chunk_and_window_hashes_are_those_stored_memory_holds(note: str) -> None:
    # Every length around the stride (the last chunk on it or not), both strides, and more
    # windows than one block: the batched hashing gives the same fingerprints, in order.
    for length in range(0, 60):
        for step in (1, guardian_memory.CHUNK_STRIDE):
            text = note[:length]
            assert guardian_memory._chunks_at(text, step) == _naive_chunks(text, step)
    long_text = note * (3 * guardian_memory._WINDOW_BLOCK // len(note) + 1)
    assert guardian_memory._chunks_at(long_text, 1) == _naive_chunks(long_text, 1)
    data = long_text.lower().encode()
    size = guardian_memory.PRINT_BYTES
    ends = range(size, len(data) + 1)
    offsets = {fingerprints_module.fingerprint(data[end - size : end]) for end in ends}
    assert offsets <= guardian_memory.window_prints([data])
