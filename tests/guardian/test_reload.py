"""Policy reload without dropping turns: on SIGHUP or a changed file; a broken file is refused
(issue 3 § Policy: "Reload on SIGHUP or file change without dropping turns")."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aap_server import aos
from aap_server.guardian.policy import load_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.guardian.reload import PolicyReloader
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO

DENY_HELLO = """
[[rules]]
id = "no-hello"
action = "deny"
reason_code = "hello"
match.method = ["steps/message"]
"""


def hello() -> aos.AosRequest:
    steps = StepFactory(
        agent=aos_agent(DEMO, []),
        session_id="s",
        turn_id="t",
        principal=Principal(user_id="u", org_id="o"),
    )
    return steps.message("user", "hello")


async def test_a_changed_policy_file_is_picked_up_and_a_broken_one_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("version = 1\n")
    guardian = PolicyGuardian(load_policy(path))
    reloader = PolicyReloader(guardian, path)
    assert (await guardian.check(hello())).decision == "allow"

    path.write_text(DENY_HELLO)
    watcher = asyncio.create_task(reloader.watch(0.01))
    try:
        async with asyncio.timeout(5):
            # The watcher polls the file's stamp; wait (bounded) for it to notice.
            while (await guardian.check(hello())).decision != "deny":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        in_force = guardian.policy.hash

        path.write_text("[[rules]]\nid = 'broken'\n")  # no action: refused
        assert reloader.reload() is False
        assert guardian.policy.hash == in_force
    finally:
        watcher.cancel()


def test_sighup_reload_reports_whether_the_policy_changed(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("version = 1\n")
    reloader = PolicyReloader(PolicyGuardian(load_policy(path)), path)
    assert reloader.reload() is False  # same content
    path.write_text(DENY_HELLO)
    assert reloader.reload() is True
