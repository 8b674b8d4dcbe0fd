"""The ``h`` fixture: every conformance test runs once per store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.conformance import harness as harnesses
from tests.conformance.harness import Harness, MemoryHarness, MySQLHarness, PostgresHarness, run


@pytest.fixture(params=["memory", "postgres", "mysql"])
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness: Harness
    if request.param == "memory":
        harness = MemoryHarness()
    elif request.param == "mysql":
        harness = MySQLHarness(request.getfixturevalue("mysql_url"))
    else:
        harness = PostgresHarness(request.getfixturevalue("database_url"))
    with asyncio.Runner() as runner:
        harnesses.runner = runner
        try:
            run(harness.store.open())
            run(harness.admin.open())
            try:
                yield harness
            finally:
                run(harness.admin.close())
                run(harness.store.close())
        finally:
            harnesses.runner = None
