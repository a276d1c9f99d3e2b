"""README § Host a real agent is real: the config-only agent loads and is served, and the
one-file Python agent passes ruff and mypy --strict as written and runs a turn when loaded
through `agent_modules`, against a fake OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from aap_server.api import create_app
from aap_server.config import Settings, load_settings
from tests.conftest import KEYS, serve
from tests.toolkits.fake_openai import fake_openai, text_reply, tool_calls_reply

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def section_block(language: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Host a real agent") : text.index("## The demo agent")]
    block = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert block is not None, f"README § Host a real agent lost its {language} example"
    return block.group(1)


def test_the_config_only_agent_loads_as_documented(tmp_path: Path) -> None:
    config = tmp_path / "aap.toml"
    config.write_text(section_block("toml"), encoding="utf-8")
    (agent,) = load_settings(config, environ={}).agents
    assert (agent.name, agent.model, agent.tools) == ("assistant", "qwen3:4b", ["current_time"])
    assert agent.base_url == "http://127.0.0.1:11434/v1"


@pytest.fixture
def grocer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "grocer.py"
    path.write_text(section_block("python"), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "grocer", raising=False)
    return path


def test_the_one_file_agent_passes_ruff_and_mypy_strict_as_written(grocer: Path) -> None:
    # From the project root, so mypy reads aap_server's sources (an editable install's import
    # hook hides them from it; an installed wheel would not).
    for command in (
        ["ruff", "check", "--config", str(ROOT / "pyproject.toml"), str(grocer)],
        ["ruff", "format", "--check", "--config", str(ROOT / "pyproject.toml"), str(grocer)],
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(grocer),
        ],
    ):
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
        assert done.returncode == 0, f"{command[:3]}: {done.stdout}{done.stderr}"


async def test_the_one_file_agent_is_served_from_agent_modules_and_uses_its_tool(
    grocer: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fake_openai() as fake:
        monkeypatch.setenv("GROCER_BASE_URL", fake.base_url)
        fake.script(tool_calls_reply(("price", {"fruit": "pear"})), text_reply("0.75 EUR a kg."))
        settings = Settings(
            db=str(tmp_path / "aap.db"),
            api_keys=KEYS,
            agent_modules=["grocer"],
            entry_point_agents=False,
        )
        async with (
            serve(create_app(settings)) as base_url,
            httpx.AsyncClient(
                base_url=base_url, headers={"Authorization": "Bearer key-alice"}, timeout=30
            ) as client,
        ):
            meta = (await client.get("/meta")).json()
            assert [agent["name"] for agent in meta["agents"]] == ["grocer"]
            created = await client.post(
                "/sessions",
                json={"agent": {"name": "grocer", "tools": [{"name": "price", "trust": True}]}},
            )
            session_id = created.json()["sessionId"]
            turn = await client.post(
                f"/sessions/{session_id}/turns",
                json={"messages": [{"role": "user", "content": "How much are pears?"}]},
            )
    messages = turn.json()["messages"]
    assert messages[1] == {
        "role": "tool",
        "toolCallId": messages[0]["content"][0]["toolCallId"],
        "content": "0.75 EUR per kg",
    }
    assert messages[2] == {"role": "assistant", "content": "0.75 EUR a kg."}
    assert fake.requests[1].body["messages"][-1]["content"] == "0.75 EUR per kg"


async def test_the_mcp_knowledge_and_memory_agents_appear_in_meta_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### MCP tools, knowledge and memory") :]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    monkeypatch.chdir(tmp_path)  # ./docs and ./aap-memory.db, as the example has them
    (tmp_path / "docs" / "hr").mkdir(parents=True)
    (tmp_path / "docs" / "welcome.md").write_text("Welcome aboard.", encoding="utf-8")
    # `mcp-server-time` is installed next to this Python (the dev extra).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    config = tmp_path / "aap.toml"
    config.write_text(block.group(1), encoding="utf-8")
    settings = load_settings(config, environ={}, overrides={"entry_point_agents": False})
    async with (
        serve(create_app(settings)) as base_url,
        httpx.AsyncClient(base_url=base_url) as client,
    ):
        meta = (await client.get("/meta")).json()
    agents = {agent["name"]: agent for agent in meta["agents"]}
    assert list(agents) == ["clock", "handbook", "buddy"]
    clock_tools = [tool["name"] for tool in agents["clock"]["tools"]]
    assert clock_tools == ["time__get_current_time", "time__convert_time"]
    assert "UTC" in json.dumps(agents["clock"]["tools"])  # the server's own descriptions
    assert "tools" not in agents["handbook"]
    assert "tools" not in agents["buddy"]
    assert meta["extensions"] == {"aap-server/memories": {"path": "/memories", "agents": ["buddy"]}}
    assert (tmp_path / "aap-memory.db").exists()
