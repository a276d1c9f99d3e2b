"""The compromised-model scenarios (tests/scenarios): a model that obeys every instruction
it reads in tool results, over mail/calendar/files/bank/chat/travel workspaces, through a
real server on loopback. Prints, for the shipped default policy and for the default with its
injection detector switched off (provenance alone), how many injected harmful actions ran,
how many user tasks completed without an approval prompt, and the approvals asked; and,
for comparison, the default without its provenance rules (the policy before them).

    python bench/scenarios.py
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.scenarios.runner import run_scenarios, without_injection_detection, without_provenance


async def main() -> None:
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "default").mkdir()
        (root / "provenance").mkdir()
        (root / "before").mkdir()
        default = await run_scenarios(root / "default")
        alone = await run_scenarios(root / "provenance", without_injection_detection(root))
        before = await run_scenarios(root / "before", without_provenance(root))
    print(f"{'':46} {'default policy':>16} {'no injection rule':>18} {'no provenance rules':>20}")
    for (label, value), (_, other), (_, old) in zip(
        default.rows(), alone.rows(), before.rows(), strict=True
    ):
        print(f"{label:46} {value:>16} {other:>18} {old:>20}")


if __name__ == "__main__":
    asyncio.run(main())
