"""A Debezium row's message headers: the id, and the ``--field-header`` columns that are not null."""

from __future__ import annotations

from relay.store.postgres.store import debezium_headers


def test_the_id_always_and_the_asked_columns_under_their_names() -> None:
    row = {"id": "4d47e190", "type": "OrderCreated", "aggregatetype": "Order", "tenant": None}
    assert debezium_headers({}, "4d47e190", ()) == {"id": "4d47e190"}  # no --field-header: no columns read
    assert debezium_headers(row, "4d47e190", (("type", "eventType"), ("aggregatetype", "aggregate"))) == {
        "id": "4d47e190",
        "eventType": "OrderCreated",
        "aggregate": "Order",
    }
    # A null column sends no header.
    assert debezium_headers(row, "4d47e190", (("tenant", "tenant"),)) == {"id": "4d47e190"}
