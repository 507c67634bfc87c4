"""Where the running policy comes from: the versioned PolicyStore and its file watcher.

The gateway reads ``current()`` on every request; the store's subscription swaps in a
newly built policy whole, so a request sees either the old or the new policy, never a mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from controller.config import PolicyConfig
from controller.metrics import Metrics
from controller.policy_state import RunningPolicy
from controller.policy_store import PolicyStore
from policies.model import PolicySpec

log = logging.getLogger(__name__)


class PolicySource:
    def __init__(self, config: PolicyConfig, metrics: Metrics, block_size: int) -> None:
        self.config = config
        self.metrics = metrics
        self.block_size = block_size
        # Raises InvalidDocument when the file is invalid and no kept version exists.
        self.store = PolicyStore(config.path, config.versions_dir)
        version, _, spec = self.store.current()
        self._running = self._build(version, spec)
        metrics.policy_version.set(version)
        self.store.subscribe(self.swap)
        self._watch: asyncio.Task[None] | None = None

    def current(self) -> RunningPolicy:
        return self._running

    def _build(self, version: int, spec: PolicySpec) -> RunningPolicy:
        return RunningPolicy.build(version, spec, self.block_size, self.config.path.parent)

    def swap(self, spec: PolicySpec, version: int) -> None:
        self._running = self._build(version, spec)
        self.metrics.policy_version.set(version)
        log.info("policy version %d (%s) is now running", version, spec.kind)

    async def start(self) -> None:
        watch = self.store.watch(self.config.reload_debounce_s)
        self._watch = asyncio.create_task(watch, name="policy-watch")

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
