"""Where the running policy comes from: the policy file (and its store, once started)."""

from __future__ import annotations

import logging

from controller.config import PolicyConfig
from controller.metrics import Metrics
from controller.policy_state import RunningPolicy
from policies.model import PolicySpec, parse_policy

log = logging.getLogger(__name__)


class PolicySource:
    """Holds the RunningPolicy the gateway reads on every request; swapped whole on change."""

    def __init__(self, config: PolicyConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self._running = RunningPolicy.build(0, PolicySpec())

    def current(self) -> RunningPolicy:
        return self._running

    def swap(self, spec: PolicySpec, version: int) -> None:
        self._running = RunningPolicy.build(version, spec)
        self.metrics.policy_version.set(version)
        log.info("policy version %d (%s) is now running", version, spec.kind)

    async def start(self) -> None:
        path = self.config.path
        if not path.exists():
            log.warning("policy file %s not found; running the default static policy", path)
            self.swap(PolicySpec(), 0)
            return
        self.swap(parse_policy(path.read_text(encoding="utf-8")), 1)

    async def close(self) -> None:
        return None
