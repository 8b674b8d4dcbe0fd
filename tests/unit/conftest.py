"""Fixtures the unit tests share."""

from __future__ import annotations

from typing import Any

import pytest

from relay import app


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What ``outbox-relay run`` would serve, each run's config, instead of serving it (no I/O); the
    collector's thresholds ``run`` sets are put back by tests/conftest.py, for every test."""
    configs: list[Any] = []

    async def serve(run_config: Any) -> None:
        configs.append(run_config)

    monkeypatch.setattr(app, "serve", serve)
    for name in ("RELAY_BATCH_BYTES", "RELAY_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return configs
