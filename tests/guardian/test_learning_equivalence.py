"""What the guardian learns from a text (`words_of`) and how it keeps fingerprints (`Prints`)
give exactly what the code before their fast paths gave (`learning_reference.py`): the same
fingerprints for every text, and the same set, order, `saturated` flag and `take_touched`
for every sequence of adds, so session memory stored by either reads back the same. And the
work stays linear in the input on the shapes the fast paths treat apart."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aap_server.guardian import fingerprints as fast_prints
from aap_server.guardian import provenance
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.guardian.provenance import Provenance, ProvenanceMemory, words_of
from tests.conftest import best_cpu_seconds
from tests.guardian import learning_reference as reference
from tests.guardian.test_fast_paths import assert_learnt_as_plainly
from tests.guardian.test_provenance import pay, steps, verdict_of

# Pieces each path of `words_of` cares about: delimiters and edge punctuation (alone, in
# runs, at a part's edge), JSON's `"key":value`, decimals with and without trailing zeros,
# `mailto:` addresses, URLs, e-mail addresses, dots inside and at the edge of a word, every
# kind of whitespace `str.split` cuts at (and `bytes.split` does not: `\x1c`-`\x1f`), and
# non-ASCII letters (some change length or case oddly when lower-cased), a lone surrogate.
PIECES = [
    '"', "'", "<", ">", "(", ")", "[", "]", "{", "}", ",", ";", "!", "?", "`", "|", "*",
    ".", ":", "#", "@", "/", "-", "_", "=", "+", '":', '","', "},{", "::", "..", "-.",
    "id", "ab", "abc", "Bob", "ord_000180", "13.7", "45.50", "45.5", "2466.0", "0.0", "1.0",
    "100", "-12.50", "1.2.3", "v1.0", "x.y", "end.", ".x", "mailto:", "mailto:Bob@Ex.ample",
    "MAILTO:x", "mailto:1.50", "m", "mm0", "bob@ex.ample.org", "https://Ex.ample/p?q=1",
    "ftp://u@h.st/", "://", "2024-05-13T10:30:00Z", "10:30:00", "DE89370400440532013000",
    " ", "  ", "\n", "\t", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85",
    "\u00a0", "\u2028", "\u3000", "é", "É", "İ", "ǅ", "ß", "ﬁ", "Σ", "\u0663.\u0660",
    "\u212a", "план", "\ud800", "0", "1", "9",
]  # fmt: skip

_pieces = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)


def _json_values() -> st.SearchStrategy[object]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**12), 10**12),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(PIECES),
        _pieces,
        st.text(max_size=12),
    )
    keys = st.one_of(st.sampled_from(["id", "at", "total", "x:y", "url", "ÜBER"]), st.text())
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=6), st.dictionaries(keys, inner, max_size=6)
        ),
        max_leaves=40,
    )


def _encoded(value: object, form: int) -> str:
    if form == 0:  # compact (one word): what msgspec and most APIs send
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if form == 1:  # Python's default: a space after `,` and `:`
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, indent=2)


_json_texts = st.builds(_encoded, _json_values(), st.integers(0, 2))


# Many distinct words (past the thresholds past which words are picked and hashed in
# batches), most with a value character, between whitespace of every kind; ASCII only (the
# fast paths' case) or not.
def _many_words(pieces: list[str], spaces: list[str]) -> st.SearchStrategy[str]:
    return st.lists(
        st.tuples(
            st.lists(st.sampled_from(pieces), min_size=1, max_size=3).map("".join),
            st.one_of(st.integers(0, 10**6).map(str), st.just("")),
            st.sampled_from(spaces),
        ),
        min_size=20,
        max_size=150,
    ).map(lambda words: "".join(f"{word}{number}{space}" for word, number, space in words))


_ASCII_PIECES = [piece for piece in PIECES if piece.isascii()]
_ASCII_SPACES = [" ", "  ", "\n", "\t", "\x1c", ". "]

# Repeated (past `_SPLIT_WHOLE_BELOW`: the long-text paths) or not.
_texts = st.builds(
    lambda text, times: text * times,
    st.one_of(
        _pieces,
        _json_texts,
        _many_words(_ASCII_PIECES, _ASCII_SPACES),
        _many_words(PIECES, [*_ASCII_SPACES, "\u00a0", "\u3000"]),
        st.text(),
        st.text(st.characters(codec="ascii")),
    ),
    st.sampled_from([1, 1, 3, 40]),
)


def _same_words(text: str) -> None:
    for values_only in (False, True):
        learnt = words_of(text, values_only)
        assert_learnt_as_plainly(learnt, set(reference.words_of(text, values_only)), text)


@settings(max_examples=600, deadline=None)
@given(_texts)
def test_every_text_teaches_the_fingerprints_it_taught_before(text: str) -> None:
    _same_words(text)


def _rows(count: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [
        {
            "id": f"ord_{rng.randrange(10**6):06d}",
            "total": rng.choice([n * 13.7, rng.randrange(10**4) / 100, float(n), n]),
            "at": f"2024-05-{n % 28 + 1:02d}T10:30:00Z",
            "to": rng.choice(["bob@ex.ample", "mailto:Eve@Evil.example", "https://x.example/p"]),
            "note": rng.choice(["see e.g. the plan", "v1.2.3 end.", "Café über", "ok"]),
        }
        for n in range(count)
    ]


@pytest.mark.parametrize("form", [0, 1, 2])
def test_tool_results_as_tools_send_them_teach_what_they_did(form: int) -> None:
    """JSON results of every size (one word; words few and many, with dots inside), and
    4 KB prose, as the benchmark's samples are."""
    for seed in range(60):
        _same_words(_encoded(_rows(seed % 70, seed), form))
    prose = "ref 000042: the team moved the launch. Pay 45.50 to DE89370400440532013000. "
    _same_words(prose * 60)
    _same_words((prose + "v1.2 e.g. x.y ") * 60)
    spaced = json.dumps(_rows(60, 1)).lower()  # (ASCII: non-ASCII escaped)
    found = provenance._value_words(spaced)
    assert found is not None
    assert len(found) > provenance._FIND_VALUE_WORDS_UP_TO  # (picked by C-level passes)
    assert len(found) > provenance._WORDS_LOOKED_UP  # (hashed in one batch)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=20))
def test_the_fingerprints_are_the_same_function(chunks: list[bytes]) -> None:
    assert fast_prints.fingerprints(chunks) == reference.fingerprints(chunks)
    assert [fast_prints.fingerprint(c) for c in chunks] == [
        reference.fingerprint(c) for c in chunks
    ]


# An add sequence: single adds, batches (lists or one-pass iterators, repeats inside), and
# takes of what was touched; values from a small pool, so repeats and re-adds are common.
_values = st.one_of(st.integers(0, 12), st.integers(0, 2**64 - 1))
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _values),
        st.tuples(st.just("add_all"), st.lists(_values, max_size=12), st.booleans()),
        st.tuples(st.just("take")),
    ),
    max_size=60,
)


def _apply(prints: fast_prints.Prints | reference.Prints, operation: tuple[object, ...]) -> object:
    if operation[0] == "add":
        value = operation[1]
        assert isinstance(value, int)
        return prints.add(value)
    if operation[0] == "add_all":
        values = operation[1]
        assert isinstance(values, list)
        return prints.add_all(iter(values) if operation[2] else list(values))
    return prints.take_touched()


def _state(prints: fast_prints.Prints | reference.Prints) -> tuple[object, ...]:
    return (prints.values(), prints.saturated, len(prints), prints.touched())


def _same_prints(limit: int, operations: list[tuple[object, ...]]) -> None:
    fast, plain = fast_prints.Prints(limit), reference.Prints(limit)
    for operation in operations:
        assert _apply(fast, operation) == _apply(plain, operation), operation
        assert _state(fast) == _state(plain), operation
    assert fast.take_touched() == plain.take_touched()
    probes = list(range(13))
    assert [p in fast for p in probes] == [p in plain for p in probes]
    assert fast.meets(probes) == plain.meets(probes)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 8), _operations)
def test_every_sequence_of_adds_keeps_what_it_kept_before(
    limit: int, operations: list[tuple[object, ...]]
) -> None:
    _same_prints(limit, operations)


def test_steps_into_a_full_set_keep_what_they_kept_before() -> None:
    """The session's own shape: hundreds of fingerprints a step into a set of 2,048 (mostly
    new, some seen again), its touched values taken now and then (a stored step)."""
    rng = random.Random(7)
    for limit in (2048, 150, 149):
        operations: list[tuple[object, ...]] = []
        for _ in range(120):
            roll = rng.random()
            if roll < 0.15:
                operations.append(("take",))
            elif roll < 0.2:
                operations.append(("add", rng.randrange(6000)))
            else:
                batch = [rng.randrange(6000) for _ in range(rng.choice([0, 1, 149, 150, 400]))]
                operations.append(("add_all", batch, rng.random() < 0.3))
        _same_prints(limit, operations)
    # Private values: added one by one, thousands forgotten (`_prints` copied now and then).
    singles: list[tuple[object, ...]] = [("add", rng.randrange(4000)) for _ in range(3000)]
    singles[1500:1500] = [("take",), ("add_all", list(range(40)), False), ("take",)]
    _same_prints(7, singles)


def test_memory_stored_by_either_reads_back_the_same() -> None:
    """A provenance exported by the code before (its `Prints`) and read back by this code is
    the memory it was, and this code exports what the code before did for the same adds."""
    rng = random.Random(3)
    batches = [[rng.randrange(10**18) for _ in range(rng.randrange(300))] for _ in range(30)]
    old_trusted, old_untrusted = reference.Prints(2048), reference.Prints(2048)
    fresh = Provenance()
    for batch in batches:
        old_untrusted.add_all(batch)
        old_trusted.add_all(batch[::3])
        fresh.untrusted.add_all(batch)
        fresh.trusted.add_all(batch[::3])
    stored = ProvenanceMemory(trusted=old_trusted.values(), untrusted=old_untrusted.values())
    read = Provenance.from_export(
        msgspec.json.decode(msgspec.json.encode(stored), type=ProvenanceMemory)
    )
    assert read.export() == stored
    assert old_untrusted.saturated
    assert fresh.untrusted.saturated
    # (that untrusted values were forgotten is stored too, which earlier versions did not)
    assert fresh.export() == msgspec.structs.replace(stored, untrusted_saturated=True)


async def test_a_value_in_a_spaced_json_result_still_needs_approval_to_leave() -> None:
    """A JSON result with a space after each `,` and `:` and many value words (cut and
    hashed in one batch): an account read there, paid to, is untrusted."""
    guardian, make = PolicyGuardian(default_policy()), steps()
    await guardian.check(make.message("user", "Pay the invoice in my inbox please"))
    await guardian.check(make.tool_call_request("c1", "read_mail", {}))
    rows = _rows(60, 11)
    rows[37]["account"] = "acct-7734190255"
    result = json.dumps(rows)
    assert provenance._print("acct-7734190255") in words_of(result, True)
    await guardian.check(make.tool_call_result("c1", result, False))
    verdict = await verdict_of(
        guardian, make.tool_call_request("c2", "send_money", pay("acct-7734190255"))
    )
    assert verdict != "allow"


def _json_rows(size: int, spaced: bool) -> str:
    row = '{"id": "ord_%06d", "total": %d.50, "at": "2024-05-13T10:30:00Z"}'
    text = ", ".join(row % (n, n) for n in range(size // 60 + 1))
    return text if spaced else text.replace(", ", ",").replace(": ", ":")


# Inputs the fast paths treat apart, 100 KB and 1 MB of each: compact JSON (one word of many
# parts), one long word, many tiny parts, spaced JSON (many value words), words with dots.
_HUGE: dict[str, Callable[[int], str]] = {
    "compact JSON": lambda size: _json_rows(size, spaced=False),
    "spaced JSON": lambda size: _json_rows(size, spaced=True),
    "one word": lambda size: "a1" * (size // 2),
    "tiny parts": lambda size: "a," * (size // 2),
    "tiny value words": lambda size: "1 " * (size // 2),
    "dotted words": lambda size: "a.b x. " * (size // 7),
    "edge runs": lambda size: ("1" + ":" * 999 + ",") * (size // 1001),
}


@pytest.mark.parametrize("name", sorted(_HUGE))
@pytest.mark.parametrize("values_only", [False, True])
def test_learning_is_linear_on_huge_input(name: str, values_only: bool) -> None:
    small, large = _HUGE[name](100_000), _HUGE[name](1_000_000)
    ratio = best_cpu_seconds(lambda: words_of(large, values_only)) / max(
        best_cpu_seconds(lambda: words_of(small, values_only)), 1e-4
    )
    # Linear: ~10; quadratic: ~100.
    assert ratio < 30, f"{name}: 10x the input cost {ratio:.0f}x the CPU time"


def test_adding_is_linear_in_the_values_added() -> None:
    def adds(count: int) -> Iterator[list[int]]:
        return ([n * 7919 + k for k in range(400)] for n in range(count // 400))

    def run(count: int) -> None:
        prints = fast_prints.Prints(2048)
        for batch in adds(count):
            prints.add_all(batch)
            prints.add_all(batch[:10])  # seen again
            prints.take_touched()

    ratio = best_cpu_seconds(lambda: run(1_000_000)) / max(
        best_cpu_seconds(lambda: run(100_000)), 1e-4
    )
    assert ratio < 30, f"10x the values cost {ratio:.0f}x the CPU time"


def test_adding_one_by_one_is_linear_in_the_values_added() -> None:
    """Each value added to a full set forgets the oldest: finding it stays cheap however many
    were forgotten before."""

    def run(count: int) -> None:
        prints = fast_prints.Prints(4096)
        for value in range(count):
            prints.add(value * 7919)

    ratio = best_cpu_seconds(lambda: run(400_000)) / max(
        best_cpu_seconds(lambda: run(40_000)), 1e-4
    )
    assert ratio < 30, f"10x the values cost {ratio:.0f}x the CPU time"
