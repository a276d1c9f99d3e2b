"""`python bench/agent_turns.py` (issue 9's closing note): run as a user runs it, each agent kind
prints one turn that ended normally and the audit record of its kind's step, allowed."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Each kind's header as printed, and the step its turn must have taken (the guardian allowing it).
EXPECTED = {
    "llm: agent 'chat'": "steps/message",
    "llm + MCP tools: agent 'librarian'": "protocols/MCP",
    "llm + knowledge: agent 'docs'": "steps/knowledgeRetrieval",
    "llm + memory: agent 'buddy'": "steps/memoryStore",
    "llm + A2A delegation: agent 'boss'": "protocols/A2A",
    "llm web agent + AOM: agent 'web'": "steps/toolCallRequest",
    "demo (bundled Python agent): agent 'demo'": "steps/toolCallRequest",
}
ROW = re.compile(r"^\s+\d+\s+(\S+)\s+(allow|deny|modify)\b", re.MULTILINE)


def sections(output: str) -> dict[str, str]:
    """Each kind's printed block by its header (without the header's `(its step: …)`)."""
    blocks = output.split("\n== ")[1:]
    return {block.split(" (its step")[0]: block for block in blocks}


async def test_the_script_prints_each_agent_kinds_step_from_the_audit_trail() -> None:
    script = await asyncio.create_subprocess_exec(
        sys.executable,
        "bench/agent_turns.py",
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    async with asyncio.timeout(600):
        out, err = await script.communicate()
    assert script.returncode == 0, err.decode()
    printed = sections(out.decode())

    assert list(printed) == list(EXPECTED)
    for header, method in EXPECTED.items():
        own = printed[header].partition("on the A2A peer")[0]
        assert "stop reason: end_turn;" in own, header
        rows = ROW.findall(own)
        assert (method, "allow") in rows, (header, rows)
        # Every turn starts with the user's message, checked before the agent sees it.
        assert rows[0] == ("steps/message", "allow"), header
    # The delegated turn on the peer was triggered by the A2A call, and guarded as such.
    peer_rows = ROW.findall(printed["llm + A2A delegation: agent 'boss'"].partition("peer")[2])
    assert ("steps/agentTrigger", "allow") in peer_rows
    assert ("protocols/A2A", "allow") in peer_rows
    # The AOM action reached the site.
    assert "the site received submit_login on /login" in printed["llm web agent + AOM: agent 'web'"]
