"""The README's example agent is real: it runs as written (README § Writing an agent)."""

from __future__ import annotations

import re
from pathlib import Path

from aap_server.agent import Agent
from tests.conftest import harness

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_agent() -> Agent:
    block = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block is not None, "README lost its example agent"
    namespace: dict[str, object] = {}
    exec(compile(block.group(1), str(README), "exec"), namespace)
    agent = namespace["AGENT"]
    assert isinstance(agent, Agent)
    return agent


async def test_readme_example_agent_answers_and_calls_its_tool(tmp_path: Path) -> None:
    async with harness(tmp_path, agents=[readme_agent()]) as h:
        created = await h.client.post(
            "/sessions",
            json={"agent": {"name": "shout", "tools": [{"name": "clock", "trust": True}]}},
        )
        session_id = created.json()["sessionId"]
        turns = f"/sessions/{session_id}/turns"

        shouted = await h.client.post(turns, json={"messages": [{"role": "user", "content": "hi"}]})
        assert shouted.json()["messages"] == [{"role": "assistant", "content": "HI"}]

        timed = await h.client.post(
            turns, json={"messages": [{"role": "user", "content": "what time is it"}]}
        )
        messages = timed.json()["messages"]
        assert messages[1]["role"] == "tool"
        assert messages[1]["content"] == "12:00"


def test_readme_example_policy_is_a_valid_policy() -> None:
    from aap_server.guardian.policy import parse_policy

    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Policy files") :]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    policy = parse_policy(block.group(1).encode(), "README")
    assert [rule.id for rule in policy.rules] == [
        "hide-emails-from-the-model",
        "email-tool-gets-real-addresses",
        "ask-before-mailing-strangers",
    ]


def _toml_blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_configuration_and_policy_examples_load(tmp_path: Path) -> None:
    """Every TOML example is either a configuration file or a policy file, and loads."""
    from aap_server.config import load_settings
    from aap_server.guardian.policy import load_policy

    blocks = _toml_blocks()
    assert len(blocks) >= 3
    for index, block in enumerate(blocks):
        path = tmp_path / f"example{index}.toml"
        path.write_text(block.replace("…", "x"), encoding="utf-8")
        if "[[rules]]" in block:
            assert load_policy(path).rules
        else:
            load_settings(path, environ={})
