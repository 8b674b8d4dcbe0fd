"""The scheduled figures of a status reading reach /metrics."""

from __future__ import annotations

from relay.metrics import Metrics
from relay.store.base import Status


def test_scheduled_events_and_the_keys_waiting_on_them_are_gauges() -> None:
    metrics = Metrics()
    metrics.observe_status(Status(5, 1, 0, 2.5, scheduled=3, keys_waiting_on_schedule=2))
    text = metrics.render().decode()
    assert "\noutbox_relay_scheduled 3.0\n" in text
    assert "\noutbox_relay_keys_waiting_on_schedule 2.0\n" in text
    assert "\noutbox_relay_pending 5.0\n" in text
