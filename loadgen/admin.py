"""Policies put on a draftctl daemon through its admin API, the original always restored."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

log = logging.getLogger(__name__)


class AdminError(RuntimeError):
    """The admin API refused or could not be reached; the message says why."""


class PolicySwitch:
    """``apply(text)`` puts a policy on the daemon; ``restore()`` puts the original back."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str | None):
        self._session = session
        self._url = url
        self._headers = {} if not token else {"authorization": f"Bearer {token}"}
        self.original: str | None = None

    async def fetch_original(self) -> str:
        async with self._session.get(f"{self._url}/admin/policy", headers=self._headers) as r:
            if r.status != 200:
                raise AdminError(
                    f"GET {self._url}/admin/policy answered {r.status}: {(await r.text())[:300]}"
                    " (is this a draftctl daemon? set --admin-token or DRAFTCTL_ADMIN_TOKEN)"
                )
            self.original = await r.text()
            return self.original

    async def apply(self, text: str, name: str) -> None:
        async with self._session.put(
            f"{self._url}/admin/policy", data=text.encode(), headers=self._headers
        ) as r:
            if r.status != 200:
                detail = (await r.text())[:500]
                raise AdminError(f"policy {name} was refused ({r.status}): {detail}")

    async def restore(self) -> None:
        if self.original is not None:
            await self.apply(self.original, "original (restore)")


@contextlib.asynccontextmanager
async def policy_switch(
    session: aiohttp.ClientSession, url: str, token: str | None, backup: Path
) -> AsyncIterator[PolicySwitch]:
    """A switch whose original policy is put back on exit, on errors and Ctrl-C too; the
    original is also saved to ``backup`` first, in case restoring fails."""
    switch = PolicySwitch(session, url, token)
    original = await switch.fetch_original()
    backup.parent.mkdir(parents=True, exist_ok=True)
    backup.write_text(original)
    try:
        yield switch
    finally:
        try:
            await switch.restore()
            log.info("restored the daemon's original policy")
        except (AdminError, aiohttp.ClientError, OSError) as exc:
            log.error(
                "could not restore the original policy (%s); it is saved in %s: "
                "PUT it back with curl -X PUT --data-binary @%s %s/admin/policy",
                exc,
                backup,
                backup,
                url,
            )
