"""The ``h`` fixture: every conformance test runs once per store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.harness import Harness, MemoryHarness, PostgresHarness, run


@pytest.fixture(params=["memory", "postgres"])
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness: Harness
    if request.param == "memory":
        harness = MemoryHarness()
    else:
        harness = PostgresHarness(request.getfixturevalue("database_url"))
    run(harness.store.open())
    run(harness.admin.open())
    try:
        yield harness
    finally:
        run(harness.admin.close())
        run(harness.store.close())
