"""Where the daemon's running policy comes from: the versioned PolicyStore and its watcher.

The gateway reads ``current()`` on every request. The store replaces its running policy
whole, built once per accepted change, so a request sees either the old or the new policy,
never a mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from controller.config import PolicyConfig
from controller.metrics import Metrics
from controller.policy.running import RunningPolicy
from controller.policy.store import PolicyStore
from controller.policy.watcher import PolicyWatcher

log = logging.getLogger(__name__)


class PolicySource:
    """The store, the watcher task and the ``draftctl_policy_version`` gauge of one daemon."""

    def __init__(self, config: PolicyConfig, metrics: Metrics, block_size: int) -> None:
        self.config = config
        self.metrics = metrics
        # Raises InvalidDocument when the file cannot be built and no kept version exists.
        self.store = PolicyStore(config.path, config.versions_dir, block_size=block_size)
        self._running = self.store.running()
        metrics.policy_version.set(self._running.version)
        self.store.subscribe(self._swap)
        self._watch: asyncio.Task[None] | None = None

    def current(self) -> RunningPolicy:
        return self._running

    def _swap(self, running: RunningPolicy) -> None:
        # The store calls this under its lock, so versions arrive in order; the object is
        # the one the store built (never built again here).
        self._running = running
        self.metrics.policy_version.set(running.version)

    async def start(self) -> None:
        watcher = PolicyWatcher(self.store, debounce_s=self.config.reload_debounce_s)
        self._watch = asyncio.create_task(watcher.run(), name="policy-watch")

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
