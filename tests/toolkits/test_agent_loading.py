"""Agents come from entry points, `agent_modules` and `[[agents]]`; the config's agent tables
are validated at start with errors naming the agent and the field."""

from __future__ import annotations

import re
import textwrap
import uuid
from pathlib import Path

import pytest

from aap_server.api import create_app
from aap_server.cli import main
from aap_server.config import ConfigError, load_settings
from aap_server.runtime.loading import AgentLoadError, load_agents

AGENT_MODULE = """
from aap_server.agent import Agent, AgentProvider, LlmProvider, ModelInfo
from tests.conftest import EchoModel


def make(name: str) -> Agent:
    return Agent(
        name=name, version="1", instructions="", model=EchoModel(),
        provider=AgentProvider(name="t", url="https://example.invalid"),
        model_info=ModelInfo(name="e", id="e", provider=LlmProvider(name="t")),
    )


AGENT = make("{name}")
MORE = [make("{name}-two"), make("{name}-three")]
NOT_AN_AGENT = 42


def factory() -> list[Agent]:
    return [make("{name}-made")]


def broken() -> Agent:
    raise RuntimeError("no key")
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module in a fresh folder on sys.path; returns its (unique) name."""
    name = f"extagents_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(AGENT_MODULE.replace("{name}", "ext"), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_agent_modules_load_an_agent_or_a_list_by_reference(package: str) -> None:
    references = [package, f"{package}:MORE", f"{package}:factory"]
    agents = load_agents(modules=references, use_entry_points=False)
    assert [agent.name for agent in agents] == ["ext", "ext-two", "ext-three", "ext-made"]


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_such_module_here:AGENT", "agent_modules[0]: cannot import 'no_such_module_here'"),
        ("{package}:MISSING", "has no attribute 'MISSING'"),
        ("{package}:NOT_AN_AGENT", "expected an aap_server.agent.Agent, a list of them or a"),
        ("{package}:broken", "agent_modules[0] ({package}:broken): failed: RuntimeError('no key')"),
        ("not a module", "is not package.module:ATTRIBUTE"),
    ],
)
def test_a_bad_module_reference_refuses_to_start_naming_it(
    package: str, reference: str, message: str
) -> None:
    message = message.replace("{package}", package)
    with pytest.raises(AgentLoadError, match=re.escape(message)):
        load_agents(modules=[reference.replace("{package}", package)], use_entry_points=False)


def test_installed_packages_register_agents_by_entry_point(package: str, tmp_path: Path) -> None:
    dist = tmp_path / "ext_agents-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ext-agents\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[aap_server.agents]\nweather = {package}:AGENT\n", encoding="utf-8"
    )
    names = [agent.name for agent in load_agents()]
    assert "ext" in names
    assert "demo" in names  # the bundled agent is an entry point of aap-server itself


def test_the_bundled_demo_agent_can_be_left_out() -> None:
    assert load_agents(use_entry_points=False) == []


def test_two_agents_with_one_name_refuse_to_start_naming_both(package: str) -> None:
    with pytest.raises(AgentLoadError) as raised:
        load_agents(modules=[f"{package}:AGENT", package])
    assert str(raised.value) == (
        f"two agents are named 'ext': agent_modules[0] ({package}:AGENT) and "
        f"agent_modules[1] ({package}); rename one or leave one out"
    )


def test_a_declared_agent_may_not_take_a_bundled_agents_name(tmp_path: Path) -> None:
    config = tmp_path / "aap.toml"
    config.write_text(
        textwrap.dedent(
            """
            [[agents]]
            name = "demo"
            base_url = "http://127.0.0.1:11434/v1"
            model = "qwen3"
            """
        ),
        encoding="utf-8",
    )
    settings = load_settings(config, environ={})
    with pytest.raises(
        AgentLoadError,
        match=r"two agents are named 'demo': entry point 'bundled' \(agents:discover\) and "
        r"agents\[0\] \('demo'\)",
    ):
        load_agents(declared=settings.agents, use_entry_points=True)


def test_the_command_line_reports_a_load_error_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "aap.toml"
    config.write_text('agent_modules = ["no_such_module_here"]\n', encoding="utf-8")
    code = main(["openapi", "--config", str(config), "--output", str(tmp_path / "o.json")])
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith("aap-server: agent_modules[0]: cannot import 'no_such_module_here'")
    assert error.count("\n") == 1


AGENT_TABLE = """
[[agents]]
name = "helper"
base_url = "http://127.0.0.1:11434/v1"
model = "qwen3"
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            'temperature = "hot"',
            "agents[0] ('helper'): temperature: Expected `float | null`, got `str`",
        ),
        ("temperature = 2.5", "agents[0] ('helper'): temperature: must be within 0..2"),
        ("temprature = 1", "agents[0] ('helper'): Object contains unknown field `temprature`"),
        (
            'api_key_env = "AAP_TEST_UNSET_KEY"',
            "agents[0] ('helper'): api_key_env: environment variable AAP_TEST_UNSET_KEY is not set",
        ),
        (
            'tools = ["shell"]',
            "agents[0] ('helper'): tools: unknown built-in tool 'shell' "
            "(known: current_time, aom_read_surface, aom_invoke)",
        ),
        (
            'options = ["colour"]',
            "agents[0] ('helper'): options: unknown option 'colour' "
            "(known: model, base_url, api_key, temperature)",
        ),
        ('kind = "web"', "agents[0] ('helper'): kind: unknown agent kind 'web' (known: llm)"),
        (
            "extra = { messages = [] }",
            "agents[0] ('helper'): extra: messages is set by the agent itself",
        ),
        ("max_retries = 11", "agents[0] ('helper'): max_retries: must be within 0..10"),
        (
            "aom_max_response_bytes = 1023",
            "agents[0] ('helper'): aom_max_response_bytes: must be within 1024..67108864",
        ),
        (
            "aom_timeout_seconds = 0",
            "agents[0] ('helper'): aom_timeout_seconds: must be within 0..600 (and not 0)",
        ),
        ("max_event_bytes = 1023", "agents[0] ('helper'): max_event_bytes: must be at least 1024"),
        (
            'api_key = "a"\napi_key_env = "B"',
            "agents[0] ('helper'): api_key: set api_key or api_key_env, not both",
        ),
        (
            'a2a_peers = [{ name = "p", url = "ftp://x/a2a" }]',
            "agents[0] ('helper'): a2a_peers[0]: url: expected an http(s) URL",
        ),
        (
            'a2a_peers = [{ name = "p", url = "http://x/a" }, { name = "p", url = "http://y/a" }]',
            "agents[0] ('helper'): a2a_peers: two peers have one name",
        ),
        (
            'a2a_peers = [{ name = "p", url = "http://x/a", token_env = "AAP_TEST_UNSET" }]',
            "agents[0] ('helper'): a2a_peers (p): token_env: environment variable "
            "AAP_TEST_UNSET is not set",
        ),
    ],
)
def test_agent_tables_are_validated_at_start_naming_agent_and_field(
    tmp_path: Path, extra: str, message: str
) -> None:
    config = tmp_path / "aap.toml"
    config.write_text(AGENT_TABLE + extra + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_settings(config, environ={})
    assert str(raised.value) == f"{config}: {message}"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "has space", "name: 1-64 letters, digits"),
        ("base_url", "ftp://host/v1", "base_url: must be an http:// or https:// URL with a host"),
        ("base_url", "https://user:pw@host/v1", "base_url: must not carry credentials"),
        ("model", " ", "model: must not be empty"),
    ],
)
def test_required_fields_are_checked(tmp_path: Path, field: str, value: str, message: str) -> None:
    fields = {"name": "helper", "base_url": "http://127.0.0.1:11434/v1", "model": "qwen3"}
    fields[field] = value
    config = tmp_path / "aap.toml"
    lines = [f'{key} = "{text}"' for key, text in fields.items()]
    config.write_text("[[agents]]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(config, environ={})


def test_the_api_key_is_read_from_the_named_variable_and_never_printed(tmp_path: Path) -> None:
    config = tmp_path / "aap.toml"
    config.write_text(AGENT_TABLE + 'api_key_env = "MY_LLM_KEY"\n', encoding="utf-8")
    settings = load_settings(config, environ={"MY_LLM_KEY": "sk-live-secret-value"})
    assert settings.agents[0].api_key == "sk-live-secret-value"
    assert "sk-live-secret-value" not in repr(settings)
    assert "sk-live-secret-value" not in str(settings.agents)


def test_agents_and_modules_come_from_the_environment_too() -> None:
    environ = {
        "AAP_AGENTS": '[{"name": "env-agent", "base_url": "http://127.0.0.1:1/v1", "model": "m"}]',
        "AAP_AGENT_MODULES": "pkg.one:AGENT, pkg.two",
        "AAP_ENTRY_POINT_AGENTS": "false",
    }
    settings = load_settings(environ=environ)
    assert [agent.name for agent in settings.agents] == ["env-agent"]
    assert settings.agent_modules == ["pkg.one:AGENT", "pkg.two"]
    assert settings.entry_point_agents is False
    with pytest.raises(ConfigError, match=r"AAP_AGENTS\[0\] \('x'\): model: must not be empty"):
        load_settings(
            environ={"AAP_AGENTS": '[{"name": "x", "base_url": "http://h/v1", "model": ""}]'}
        )


def test_a2a_agents_must_be_hosted_agents(tmp_path: Path) -> None:
    config = tmp_path / "aap.toml"
    config.write_text(AGENT_TABLE, encoding="utf-8")
    settings = load_settings(
        config, environ={"AAP_A2A_AGENTS": "helper, nobody", "AAP_ENTRY_POINT_AGENTS": "false"}
    )
    assert settings.a2a_agents == ["helper", "nobody"]
    with pytest.raises(ConfigError, match=r"^a2a_agents: no hosted agent is named nobody$"):
        create_app(settings)
