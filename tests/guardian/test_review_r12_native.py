"""Review r12: attacks on the guardian's C extension (`aap_server/guardian/_native.c`), its
selector (`native.py`) and the callers in provenance, fingerprints and the detectors.

What held is pinned here where the input is a hard one (the checksums at their overflow
edges, the C functions against the Python reference on hand-picked texts, error paths that
leak nothing and never crash, linear time on pathological texts), and what it found and was
fixed (the collision budget weighed against distinct values only, a list subclass, an image
that built without the extension)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from aap_server.guardian import fingerprints, provenance
from aap_server.guardian.detectors import _views, scan_all
from aap_server.guardian.fingerprints import fingerprints_in_python
from tests.conftest import best_cpu_seconds
from tests.guardian.test_native import BUILT, both

needs_the_extension = pytest.mark.skipif(
    BUILT is None, reason="the C extension is not built (test_native.py says so)"
)
REPOSITORY = Path(__file__).resolve().parents[2]


def zlib_prints(chunks: list[bytes]) -> list[int]:
    return [(zlib.crc32(chunk) << 32) | zlib.adler32(chunk) for chunk in chunks]


# --- the checksums at their edges ------------------------------------------------------------


@needs_the_extension
def test_fingerprints_of_all_ones_bytes_past_adlers_deferred_modulo_are_zlibs() -> None:
    # 0xff bytes make Adler-32's sums grow fastest: a block one byte too long (5552) or a
    # modulo skipped on the short path (< 16) would overflow 32 bits and drift from zlib,
    # and every stored session memory with it.
    assert BUILT is not None
    for byte in (b"\xff", b"\x00", b"\x80"):
        lengths = [*range(33), 5551, 5552, 5553, 5552 * 2, 5552 * 2 + 1, 65_536, (1 << 22) + 7]
        chunks = [byte * n for n in lengths]
        assert BUILT.fingerprints(chunks) == zlib_prints(chunks)
        assert fingerprints_in_python(chunks) == zlib_prints(chunks)


# --- the C functions against the Python reference on hard texts -----------------------------

# Texts at the edges of what the C code cuts and normalises itself: whitespace that str.split
# takes and bytes.split does not (\x1c-\x1f), NUL and DEL, delimiter and edge runs,
# `mailto:` alone or short, decimals of zeros, currency codes glued on both sides and in
# upper case (the C code reads only lower-case codes, as the pattern does), separators
# doubled or at the run's ends, the apostrophe-free Swiss forms.
HARD_TEXTS = [
    "",
    "a",
    "ab",
    "abc",
    "mailto:",
    "mailto:ab",
    "mailto:abc",
    "-mailto:x@y.z-",
    "mailto:1.50",
    "mailto:mailto:abc",
    "0.0 00.00 0.00 100.000 1.0.0 .50 1..0 10. 10.0.",
    "a\x1cb\x1dc\x1ed\x1fe 9\x1c731 \x1c9731\x1f",
    "abc\x00def \x7f123\x7f x\x0by\x0cz\tw\rq\n",
    '"},{"a":"b"},{"c":"d"}' * 3,
    "..::##@@//--__==++abc++==__--//@@##::..",
    "usd1usd1usd1 eur9731usd 9731usdx 9731usd9 usd9731eur",
    "USD9731 9731EUR Usd9731 rent:9731 RENT:9731 amount=9,731",
    "$9,731.50 $9.731,00 $9,731 $9.731 $1,234,567 $1,234.567 $1.2.3 $1,23,456",
    "9,731,,5 9,,731 ,9731 9731, .9731 9731. 9,7310 9.7310 09,731",
    "x9,731 9,731x 9,731- -9,731 /9,731 9,731/ _9,731 9,731_",
    "1,000 1.000 1,0000 0,000 000,000 0.000,0 \\9731\\ =9731=",
    "eth1.0 btc0.50000 sar1,000.000 aed12.340",
]


@needs_the_extension
@pytest.mark.parametrize("text", HARD_TEXTS)
def test_parts_and_amounts_of_hard_texts_are_the_pythons(text: str) -> None:
    # Called as provenance calls them (lower-cased), and the C functions directly on the text
    # as it is (upper case included) against the Python code they stand for.
    for given in (text, text.lower()):
        with_c, in_python = both(provenance._parts_prints, given)
        assert sorted(with_c) == sorted(set(in_python))
        with_c, in_python = both(provenance._amount_prints, given)
        assert sorted(with_c) == sorted(set(in_python))
        for values_only in (False, True):
            with_c, in_python = both(provenance.words_of, given, values_only)
            assert set(with_c) == set(in_python)
    assert BUILT is not None
    assert sorted(BUILT.parts_prints(text) or []) == sorted(provenance._parts_prints_ascii(text))


@needs_the_extension
@pytest.mark.parametrize(
    "text",
    [
        "pay 9\u00a0731 to bob\u202f9,731 x\u2009100",  # NBSP and thin spaces: group marks
        "\udc80 9731 \ud800abc mailto:x@y.z",  # lone surrogates
        # Full-width letters and digits, other scripts' digits:
        "\uff50\uff41\uff59 \uff19\uff17\uff13\uff11 €9,731.50 ₹1,00,000 \u0669\u0667\u0663",
        "Ωmega 9731 αβγ/9,731 日本 abc.def",
        "it's 1'200.50 and 1\u2019200 'abc' ",  # apostrophes: the C amount pass is skipped
    ],
)
def test_words_of_mixed_scripts_are_the_pythons(text: str) -> None:
    for values_only in (False, True):
        with_c, in_python = both(provenance.words_of, text, values_only)
        assert set(with_c) == set(in_python)
    findings_with_c, findings_in_python = both(scan_all, text)
    assert findings_with_c == findings_in_python


@needs_the_extension
def test_distinct_words_cut_where_str_split_does() -> None:
    # str.split cuts ASCII text at \x1c-\x1f too (bytes.split does not), and at no other
    # control character (NUL, DEL, \x1b).
    assert BUILT is not None
    for text in (
        "a\x1cb\x1dc\x1ed\x1fe \x0bf\x0cg\th\ri\nj",
        "\x00a\x00 \x7fb\x7f \x1bc\x1b \x1c\x1f\x1c",
        "\x1c" * 9 + "x" * 8 + "\x1f" + "y" * 16 + "\x1d" + "z" * 17,
        "",
        " \x1c\x1d\x1e\x1f\t\n\x0b\x0c\r ",
    ):
        assert BUILT.distinct_words(text) == set(text.split())
        with_c, in_python = both(provenance.words_of, text, False)
        assert set(with_c) == set(in_python)


@needs_the_extension
def test_distinct_runs_at_whitespace_bytes_split_does_not_cut() -> None:
    # bytes.split cuts at \t\n\v\f\r and space only: \x1c-\x1f, \x85 and \xa0 stay in a run.
    assert BUILT is not None
    data = b"a\x1cb c\x1fd\x85e\xa0f \x0bg\x0ch\ti\rj\nk\x00l"
    for table in (bytes(range(256)), _views.NON_LETTERS_TO_SPACE, _views._TOKEN_MAP):
        for delete in (b"", b"\x00", b" \t", bytes(range(256))):
            assert BUILT.distinct_runs(data, table, delete) == set(
                data.translate(table, delete).split()
            )


# --- error paths: typed errors, no leak, no crash --------------------------------------------


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@needs_the_extension
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_the_c_functions_leak_nothing_on_their_error_and_give_up_paths() -> None:
    assert BUILT is not None
    table = bytes(range(256))

    def calls() -> None:
        assert BUILT is not None
        assert BUILT.fingerprints([b"abc", bytearray(b"xyz"), memoryview(b"q" * 20)])
        for bad in ([b"a", "text"], [b"a", 1], None, 5, [memoryview(b"abcd")[::2]]):
            with pytest.raises((TypeError, BufferError)):
                BUILT.fingerprints(bad)  # type: ignore[arg-type]
        assert BUILT.parts_prints("a,b mailto:x@y.z 10.50 " * 5)
        for bad_text in ("é", b"x", None):
            with pytest.raises((TypeError, ValueError)):
                BUILT.parts_prints(bad_text)  # type: ignore[arg-type]
        assert BUILT.amount_prints("$9,731.50 eur9.731,00 rent:1234")
        for bad_amounts in ("it's 1,000", "é", 3):
            with pytest.raises((TypeError, ValueError)):
                BUILT.amount_prints(bad_amounts)  # type: ignore[arg-type]
        assert BUILT.distinct_runs(b"a b c a", table, b"b") == {b"a", b"c"}
        for args in ((b"a", b"x"), ("s", table), (b"a", table, "s"), (b"a", None)):
            with pytest.raises((TypeError, ValueError)):
                BUILT.distinct_runs(*args)
        with pytest.raises(TypeError):
            BUILT.distinct_runs(b"a")  # type: ignore[call-arg]

    for _ in range(500):
        calls()
    before = _resident_bytes()
    for _ in range(10_000):
        calls()
    # A leaked object per call would be 100,000s of objects: tens of megabytes.
    assert _resident_bytes() - before < 8 << 20


@needs_the_extension
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS")
def test_out_of_memory_in_the_c_functions_is_a_memory_error_not_a_crash() -> None:
    script = textwrap.dedent(
        """
        import os, resource
        from aap_server.guardian import _native as built
        data = b"ab " * (40 << 20)
        text = " ".join("w%d" % n for n in range(2_000_000))
        used = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (used + (8 << 20), resource.RLIM_INFINITY))
        for call in (
            lambda: built.distinct_runs(data, bytes(range(256))),
            lambda: built.parts_prints(text),
        ):
            try:
                call()
            except MemoryError:
                print("MemoryError")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MemoryError", "MemoryError"]


# --- linear time on pathological texts --------------------------------------------------------

_UNITS = {
    "amount: a separator chain": "1,",
    "amount: codes glued both sides": "usd1",
    "amount: dollar signs": "$1 ",
    "amount: grouped after a letter": "x9,731 ",
    "amount: swiss-less euro form": "eur9.731,00 ",
    "parts: mailto runs": "mailto:",
    "parts: decimals of zeros": "1.00 ",
    "parts: edge runs": "a.-",
    "runs: one long repeated run": "a" * 999 + " ",
}


@needs_the_extension
@pytest.mark.parametrize("name", sorted(_UNITS))
def test_the_c_functions_are_linear_on_pathological_texts(name: str) -> None:
    assert BUILT is not None
    unit = _UNITS[name]
    table = bytes(range(256))

    def run(size: int) -> object:
        assert BUILT is not None
        text = unit * (size // len(unit))
        if name.startswith("amount"):
            return BUILT.amount_prints(text)
        if name.startswith("parts"):
            return BUILT.parts_prints(text)
        return BUILT.distinct_runs(text.encode(), table)

    ratio = best_cpu_seconds(lambda: run(1_000_000)) / max(
        best_cpu_seconds(lambda: run(100_000)), 1e-4
    )
    assert ratio < 30, f"{name}: 10x the input cost {ratio:.0f}x the CPU time"


# --- the collision budget holds on benign texts of many repeats --------------------------------


def _price_list() -> str:
    """A 1.4 MB compact JSON price list: 400 distinct prices, each 100 times."""
    rows = [
        {"sku": f"sku{n % 400}", "price": f"${1000 + (n % 400) * 7}.{(n % 400) % 97:02d}"}
        for n in range(40_000)
    ]
    return json.dumps(rows, separators=(",", ":"))


@needs_the_extension
def test_a_price_list_keeps_the_c_amount_pass() -> None:
    # The budget is per look-up (repeats included): 400 amounts each 100 times stay in C
    # under every hash seed (with a budget per distinct value they gave up, and words_of paid
    # the C pass and then the Python pass).
    assert BUILT is not None
    text = _price_list().lower()
    with_c, in_python = both(provenance._amount_prints, text)
    assert sorted(with_c) == sorted(set(in_python))  # (held)
    assert BUILT.amount_prints(text) is not None


@needs_the_extension
def test_a_large_log_of_repeated_words_keeps_the_c_passes() -> None:
    # Past 1 MB the sets start at 65,536 values: 60,000 words each 20 times fill them to
    # half, and the repeats' probes are paid for by their own look-ups.
    assert BUILT is not None
    text = " ".join([f"w{n}x/y" for n in range(60_000)] * 20)
    assert BUILT.parts_prints(text) is not None
    assert BUILT.distinct_words(text) is not None
    assert BUILT.distinct_runs(text.encode(), bytes(range(256))) is not None


# --- Prints.add_all of a list subclass --------------------------------------------------------


@needs_the_extension
def test_prints_take_a_list_subclass_with_the_extension_too() -> None:
    # The C pass takes an exact list only: add_all copies anything else into one.
    class Values(list[int]):
        pass

    with_c, in_python = both(lambda: fingerprints.Prints(8).add_all(Values([1])))
    assert with_c == in_python is True


# --- the image ------------------------------------------------------------------------------


def _build_stage() -> str:
    dockerfile = (REPOSITORY / "Dockerfile").read_text()
    return dockerfile.split("\nFROM ", 2)[1]


def test_the_images_build_stage_has_a_c_compiler() -> None:
    # python:3.11-slim has none: without one `pip wheel` drops the optional extension
    # silently and the image runs the pure-Python code.
    assert re.search(r"apt-get install[^\n]*\bgcc\b", _build_stage())


def test_the_image_fails_to_build_without_the_extension() -> None:
    dockerfile = (REPOSITORY / "Dockerfile").read_text()
    assert re.search(r"RUN [^\n]*python[^\n]*(guardian import _native|native\.BUILT)", dockerfile)
