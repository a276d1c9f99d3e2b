"""Precision and recall of every detector on the labelled corpus.

    python -m tests.guardian.detectors.report

Prints a markdown table (one row per detector id: TP, FP, FN, precision, recall) and, after
it, the cases each detector got wrong (text prefix with long tokens masked).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from aap_server.guardian.detectors import check_egress, detector_ids, scan_all
from tests.guardian.detectors.corpus import CASES, EGRESS_CASES
from tests.guardian.detectors.multilingual import LANGUAGE_CASES


@dataclass(frozen=True)
class Score:
    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


@dataclass(frozen=True)
class Evaluation:
    scores: dict[str, Score]
    errors: list[tuple[str, str, str]]  # (detector, "FP"/"FN", text)
    cases: int
    benign_cases: int


def evaluate() -> Evaluation:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    errors: list[tuple[str, str, str]] = []
    labelled: list[tuple[str, frozenset[str], set[str]]] = []
    for case in CASES:
        labelled.append((case.text, case.expected, {f.detector for f in scan_all(case.text)}))
    for egress in EGRESS_CASES:
        found = {f.detector for f in check_egress(egress.text, egress.allow, egress.deny)}
        labelled.append((egress.text, egress.expected, found))
    for text, expected, found in labelled:
        for detector in expected & found:
            tp[detector] += 1
        for detector in found - expected:
            fp[detector] += 1
            errors.append((detector, "FP", text))
        for detector in expected - found:
            fn[detector] += 1
            errors.append((detector, "FN", text))
    scores = {d: Score(tp[d], fp[d], fn[d]) for d in detector_ids()}
    benign = sum(1 for _, expected, _ in labelled if not expected)
    return Evaluation(scores, errors, len(labelled), benign)


_LONG_TOKEN = re.compile(r"[A-Za-z0-9+/_=.-]{16,}")


def _preview(text: str) -> str:
    """The start of a case's text with long tokens masked (no key material in the output)."""
    flat = _LONG_TOKEN.sub("<token>", text.replace("\n", " "))
    return flat[:48] + ("…" if len(flat) > 48 else "")


def table(evaluation: Evaluation) -> str:
    lines = [
        "| detector | TP | FP | FN | precision | recall |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for detector, s in evaluation.scores.items():
        lines.append(
            f"| `{detector}` | {s.tp} | {s.fp} | {s.fn} | {s.precision:.2f} | {s.recall:.2f} |"
        )
    total = Score(
        sum(s.tp for s in evaluation.scores.values()),
        sum(s.fp for s in evaluation.scores.values()),
        sum(s.fn for s in evaluation.scores.values()),
    )
    lines.append(
        f"| **all** | {total.tp} | {total.fp} | {total.fn} | "
        f"{total.precision:.2f} | {total.recall:.2f} |"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class LanguageScore:
    attacks: int
    caught: int  # attacks where every expected detector fired
    benign: int
    flagged: int  # benign cases with any injection finding


def by_language() -> dict[str, LanguageScore]:
    """Per language of the multilingual cases: attacks caught, benign texts flagged."""
    counts: dict[str, list[int]] = {}
    for case in LANGUAGE_CASES:
        row = counts.setdefault(case.language, [0, 0, 0, 0])
        found = {f.detector for f in scan_all(case.text) if f.category == "injection"}
        if case.expected:
            row[0] += 1
            row[1] += case.expected <= found
        else:
            row[2] += 1
            row[3] += bool(found)
    return {language: LanguageScore(*row) for language, row in counts.items()}


def language_table(scores: dict[str, LanguageScore]) -> str:
    lines = [
        "| language | attacks caught | benign flagged |",
        "|---|---:|---:|",
    ]
    for language, s in scores.items():
        lines.append(f"| {language} | {s.caught}/{s.attacks} | {s.flagged}/{s.benign} |")
    caught = sum(s.caught for s in scores.values())
    attacks = sum(s.attacks for s in scores.values())
    flagged = sum(s.flagged for s in scores.values())
    benign = sum(s.benign for s in scores.values())
    lines.append(f"| **all** | {caught}/{attacks} | {flagged}/{benign} |")
    return "\n".join(lines)


def main() -> None:
    evaluation = evaluate()
    print(
        f"Corpus: {evaluation.cases} cases ({evaluation.benign_cases} benign with no finding "
        "expected); counts are per case and detector id.\n"
    )
    print(table(evaluation))
    print(
        "\nThe multilingual cases (`tests/guardian/detectors/multilingual.py`) by language: an"
        " attack is caught when its injection detectors fire; a benign text is flagged by any"
        " injection finding.\n"
    )
    print(language_table(by_language()))
    if evaluation.errors:
        print("\nErrors:")
        for detector, kind, text in evaluation.errors:
            print(f"- {kind} `{detector}`: {_preview(text)!r}")


if __name__ == "__main__":
    main()
