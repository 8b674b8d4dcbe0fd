"""A payload holding what JSON cannot encode: one clear error on every driver, and the hook that encodes it."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from fractions import Fraction
from typing import Any

import psycopg
import pytest

import producers
from tests.integration.test_producers import DRIVERS, _in_a_business_transaction

ORDER_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
PAID_AT = datetime(2026, 12, 6, 21, 0, tzinfo=UTC)

#: (payload, where the value is, its type): money, times, ids, sets; nested in objects and arrays.
UNENCODABLE = [
    ({"total": Decimal("9.90")}, "payload['total']", "Decimal"),
    ({"order": {"paid_at": PAID_AT}}, "payload['order']['paid_at']", "datetime"),
    ({"lines": [{"sku": "a"}, {"id": ORDER_ID}]}, "payload['lines'][1]['id']", "UUID"),
    ([1, date(2026, 12, 6)], "payload[1]", "date"),
    ({"at": time(9, 30)}, "payload['at']", "time"),
    ({"tags": {"a", "b"}}, "payload['tags']", "set"),
    (Decimal("1.5"), "payload", "Decimal"),
    ({"ratio": Fraction(1, 3)}, "payload['ratio']", "Fraction"),
]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_value_json_cannot_encode_is_refused_naming_its_type_place_and_remedy_on_every_driver(
    request: pytest.FixtureRequest, driver: str
) -> None:
    # One database per driver, each payload in a transaction of its own. MySQL's drivers share one path
    # (json.dumps), psycopg's asks the connection's dumper: every type there, the three on MySQL.
    cases = UNENCODABLE if driver.startswith("psycopg") else UNENCODABLE[:3]
    for payload, where, type_name in cases:
        outcome = _in_a_business_transaction(request, driver, {"payload": payload})
        assert isinstance(outcome, tuple), f"published {payload!r}: {outcome}"
        error, message = outcome
        assert error is TypeError
        assert message.startswith(f"{where} is a {type_name}, which JSON cannot encode:"), message
        assert "json_default=str" in message and "isoformat()" in message
        assert "\n" not in message


@pytest.mark.parametrize("driver", ["psycopg", "pymysql"])
def test_json_default_encodes_them_on_every_database(request: pytest.FixtureRequest, driver: str) -> None:
    payloads: list[Any] = [payload for payload, _, _ in UNENCODABLE[:5]]
    expected = [json.loads(json.dumps(payload, default=str)) for payload in payloads]
    if driver == "psycopg":
        url = request.getfixturevalue("database_url")
        with psycopg.connect(url) as conn:
            keys = [producers.publish(conn, "t", payload, json_default=str) for payload in payloads]
            written = [
                conn.execute("SELECT payload FROM outbox WHERE idempotency_key = %s", [key]).fetchone() for key in keys
            ]
        assert written == [(value,) for value in expected]
        return
    from tests import mysql_support

    url = request.getfixturevalue("mysql_url")
    my_conn = mysql_support.connect(url, autocommit=False)
    try:
        keys = [producers.publish(my_conn, "t", payload, json_default=str) for payload in payloads]
        my_conn.commit()
    finally:
        my_conn.close()
    stored = []
    for key in keys:
        rows = mysql_support.execute(url, "SELECT payload FROM outbox WHERE idempotency_key = %s", [key])
        stored.append(json.loads(rows[0][0]))
    assert stored == expected


def test_apublish_takes_json_default_and_a_default_that_gives_up_is_the_same_clear_error(database_url: str) -> None:
    def only_decimals(value: object) -> object:
        if isinstance(value, Decimal):
            return str(value)
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    async def publish() -> tuple[str, str]:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            key = await producers.apublish(aconn, "t", {"total": Decimal("2.50")}, json_default=only_decimals)
            with pytest.raises(TypeError) as refused:
                await producers.apublish(aconn, "t", {"at": PAID_AT}, json_default=only_decimals)
            cur = await aconn.execute("SELECT payload->>'total' FROM outbox WHERE idempotency_key = %s", [key])
            row = await cur.fetchone()
            assert row is not None
            return str(row[0]), str(refused.value)

    total, message = asyncio.run(publish())
    assert total == "2.50"
    assert message.startswith("payload['at'] is a datetime, which JSON cannot encode:"), message
