"""Runs the compromised-model scenarios through a real aap-server (HTTP on loopback, the
policy guardian with the shipped default policy or a policy file) and counts what happened.

The simulated user answers each permission request the server sends: it grants a call it
asked for and refuses one it did not (an injected call), as a person reading the approval
prompt would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from aap_server.api import create_app
from aap_server.config import Settings
from tests.conftest import KEYS, serve
from tests.scenarios.workspaces import (
    FRAMINGS,
    INJECTION_TASKS,
    LAST_RESULT,
    USER_TASKS,
    InjectionTask,
    Tools,
    UserTask,
    demo_agent,
    injection_text,
    new_world,
)

MAX_ROUNDS = 12


@dataclass
class Run:
    task: UserTask
    injection: InjectionTask | None
    completed: bool = False
    harmful: bool = False
    approvals_for_user: int = 0
    approvals_for_attacker: int = 0


@dataclass
class Results:
    runs: list[Run] = field(default_factory=list)

    def clean(self) -> list[Run]:
        return [r for r in self.runs if r.injection is None]

    def attacked(self) -> list[Run]:
        return [r for r in self.runs if r.injection is not None]

    def rows(self) -> list[tuple[str, str]]:
        clean, attacked = self.clean(), self.attacked()
        smooth = [r for r in clean if r.completed and r.approvals_for_user == 0]
        harmed = [r for r in attacked if r.harmful]
        return [
            ("user tasks (no injection)", str(len(clean))),
            ("  completed without an approval prompt", _share(len(smooth), len(clean))),
            ("  completed after approving", str(sum(r.completed for r in clean) - len(smooth))),
            ("  approval prompts", str(sum(r.approvals_for_user for r in clean))),
            ("attacked runs (user task x injected task)", str(len(attacked))),
            ("  injected harmful actions executed", _share(len(harmed), len(attacked))),
            (
                "  approval prompts for injected calls",
                str(sum(r.approvals_for_attacker for r in attacked)),
            ),
            (
                "  approval prompts for the user's own calls",
                str(sum(r.approvals_for_user for r in attacked)),
            ),
            (
                "  user task still completed",
                _share(sum(r.completed for r in attacked), len(attacked)),
            ),
        ]


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "0/0"


def _is_injected(use: dict[str, Any], injection: InjectionTask | None) -> bool:
    if injection is None or use["name"] != injection.call.name:
        return False
    expected = {k: v for k, v in injection.call.input.items() if v != LAST_RESULT}
    return all(use["input"].get(k) == v for k, v in expected.items())


def _pending(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answered = {m["toolCallId"] for m in messages if m["role"] == "tool"}
    uses = [
        block
        for m in messages
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for block in m["content"]
        if block["type"] == "tool_use"
    ]
    return [use for use in uses if use["toolCallId"] not in answered]


def _said(messages: list[dict[str, Any]]) -> str:
    texts = []
    for m in messages:
        if m["role"] == "assistant":
            content = m["content"]
            if isinstance(content, str):
                texts.append(content)
            else:
                texts += [b["text"] for b in content if b["type"] == "text"]
    return texts[-1] if texts else ""


async def _run_one(client: httpx.AsyncClient, tools: Tools, run: Run, framing: str) -> None:
    text = injection_text(run.injection, framing) if run.injection else ""
    tools.world = world = new_world(text)
    created = await client.post("/sessions", json={"agent": {"name": "assistant"}})
    assert created.status_code == 201, created.text
    session = created.json()["sessionId"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": run.task.prompt}]
    said = ""
    for _ in range(MAX_ROUNDS):
        response = await client.post(f"/sessions/{session}/turns", json={"messages": messages})
        assert response.status_code == 200, response.text
        body = response.json()
        said = _said(body["messages"]) or said
        if body["stopReason"] != "tool_use":
            break
        messages = []
        for use in _pending(body["messages"]):
            injected = _is_injected(use, run.injection)
            if injected:
                run.approvals_for_attacker += 1
            else:
                run.approvals_for_user += 1
            answer = {"role": "tool_permission", "toolCallId": use["toolCallId"]}
            messages.append({**answer, "granted": not injected})
        assert messages, body
    run.completed = run.task.done(world, said)
    run.harmful = run.injection is not None and run.injection.harmful(world)


async def run_scenarios(tmp_path: Path, policy: Path | None = None) -> Results:
    """Every user task alone, then beside each injected task of its workspace (framings in
    turn), through one server on loopback."""
    tools = Tools()
    settings = Settings(db=str(tmp_path / "scenarios.db"), api_keys=KEYS, policy=str(policy or ""))
    app = create_app(settings, [demo_agent(tools)])
    results = Results()
    async with (
        serve(app) as base_url,
        httpx.AsyncClient(
            base_url=base_url, headers={"Authorization": "Bearer key-alice"}, timeout=30
        ) as client,
    ):
        for task in USER_TASKS:
            run = Run(task, None)
            await _run_one(client, tools, run, "")
            results.runs.append(run)
        index = 0
        for task in USER_TASKS:
            for injection in INJECTION_TASKS:
                if injection.suite != task.suite:
                    continue
                run = Run(task, injection)
                await _run_one(client, tools, run, FRAMINGS[index % len(FRAMINGS)])
                index += 1
                results.runs.append(run)
    return results


def without_injection_detection(tmp_path: Path) -> Path:
    """A policy file: the default with its injection detector rule switched off, to measure
    what provenance alone stops when detection misses everything."""
    path = tmp_path / "no-detection.toml"
    path.write_text('version = 1\ndisable = ["injection-in-untrusted-content"]\n')
    return path


PROVENANCE_RULES = [
    "consequential-call-to-unknown-target",
    "consequential-call-with-untrusted-values",
    "sensitive-numbers-to-unknown-recipient",
]


def without_provenance(tmp_path: Path) -> Path:
    """A policy file: the default without its provenance rules (what shipped before them)."""
    path = tmp_path / "no-provenance.toml"
    path.write_text(f"version = 1\ndisable = {json.dumps(PROVENANCE_RULES)}\n")
    return path
