"""Reloading the policy while serving: on SIGHUP or when the file changes. Turns in flight keep
the policy their checks started with; a broken new file is refused and the old one stays."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aap_server.guardian.policy import PolicyError, load_policy
from aap_server.guardian.policy_guardian import PolicyGuardian

logger = logging.getLogger("aap_server.guardian")


class PolicyReloader:
    def __init__(self, guardian: PolicyGuardian, path: str | Path) -> None:
        self.guardian = guardian
        self.path = Path(path)
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def reload(self) -> bool:
        """Load the file again; True when a new policy is now in force."""
        self._stamp = self._file_stamp()
        try:
            policy = load_policy(self.path)
        except PolicyError as error:
            logger.error("policy not reloaded, keeping the one in force: %s", error)
            return False
        if policy.hash == self.guardian.policy.hash:
            return False
        self.guardian.replace_policy(policy)
        logger.info("policy reloaded from %s (sha256 %s)", self.path, policy.hash)
        return True

    async def watch(self, interval_seconds: float = 2.0) -> None:
        """Reload whenever the file's modification time or size changes."""
        while True:
            await asyncio.sleep(interval_seconds)
            if self._file_stamp() != self._stamp:
                self.reload()
