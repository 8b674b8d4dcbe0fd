"""Fixtures the unit tests share."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from relay import app


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """What ``outbox-relay run`` would serve, each run's config, instead of serving it (no I/O); the
    collector's thresholds, which ``run`` sets for its process, are restored afterwards."""
    configs: list[Any] = []

    async def serve(run_config: Any) -> None:
        configs.append(run_config)

    monkeypatch.setattr(app, "serve", serve)
    for name in ("RELAY_BATCH_BYTES", "RELAY_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    thresholds = gc.get_threshold()
    yield configs
    gc.set_threshold(*thresholds)
