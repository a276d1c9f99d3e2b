"""The compromised-model scenarios (tests/scenarios): a model that obeys every instruction
it reads in tool results, over mail/calendar/files/bank/chat/travel workspaces, through a
real server on loopback. Prints, for the shipped default policy and for the default with its
injection detector switched off (provenance alone), how many injected harmful actions ran,
how many user tasks completed without an approval prompt, and the approvals asked.

    python bench/scenarios.py
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.scenarios.runner import run_scenarios, without_injection_detection


async def main() -> None:
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "default").mkdir()
        (root / "provenance").mkdir()
        default = await run_scenarios(root / "default")
        alone = await run_scenarios(root / "provenance", without_injection_detection(root))
    print(f"{'':46} {'default policy':>18} {'no injection rule':>18}")
    for (label, value), (_, other) in zip(default.rows(), alone.rows(), strict=True):
        print(f"{label:46} {value:>18} {other:>18}")


if __name__ == "__main__":
    asyncio.run(main())
