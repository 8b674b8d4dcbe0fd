"""``outbox-relay run`` turns its flags and their variables into the relay's settings (``serve`` stubbed)."""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from typing import Any

import pytest

from relay import app, cli, config

#: The collector's thresholds before any test ran (this module is imported at collection).
THRESHOLDS_BEFORE_THE_TESTS = gc.get_threshold()
RUN = ["run", "--database-url", "postgresql://app@127.0.0.1:5432/shop", "--sink", "kafka://127.0.0.1:9092"]


@pytest.mark.parametrize(
    ("argv", "environ", "batch_bytes"),
    [
        ([], {}, config.BATCH_BYTES),
        (["--batch-bytes", "1048576"], {}, 1_048_576),
        ([], {"RELAY_BATCH_BYTES": "65536"}, 65_536),
        (["--batch-bytes", "1"], {"RELAY_BATCH_BYTES": "65536"}, 1),  # the flag wins
    ],
)
def test_batch_bytes_reaches_the_relay_settings(
    served: list[Any], monkeypatch: pytest.MonkeyPatch, argv: list[str], environ: dict[str, str], batch_bytes: int
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert cli.main([*RUN, *argv]) == 0
    assert served[0].settings.batch_bytes == batch_bytes


@pytest.mark.parametrize("value", ["0", "-5", "16MiB", "1.5"])
def test_a_bad_batch_bytes_is_a_one_line_error(
    served: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*RUN, "--batch-bytes", value])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--batch-bytes" in error and repr(value) in error
    monkeypatch.setenv("RELAY_BATCH_BYTES", value)
    with pytest.raises(SystemExit):
        cli.main(RUN)
    assert "RELAY_BATCH_BYTES" in capsys.readouterr().err
    assert served == []


SINKS = {"Kafka": "kafka://127.0.0.1:9092", "RabbitMQ": "amqp://guest:guest@127.0.0.1:5672/%2F"}
LEASE_HELP_RE = re.compile(
    r"shorter than ([\d.]+) s to claim \+ --publish-timeout \+ the sink's grace "
    r"\(Kafka ([\d.]+) s, RabbitMQ ([\d.]+) s; with --route, the slowest route's\) \+ ([\d.]+) s to settle"
)


def lease_floor_in_help(capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    """The shortest lease ``run --help`` promises, per sink, less the publish timeout."""
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    found = LEASE_HELP_RE.search(" ".join(capsys.readouterr().out.split()))
    assert found, "run --help does not state the lease's lower bound"
    claim, kafka, rabbitmq, settle = map(float, found.groups())
    return {"Kafka": claim + kafka + settle, "RabbitMQ": claim + rabbitmq + settle}


@pytest.mark.parametrize("sink", SINKS)
def test_the_lease_floor_in_run_help_is_the_one_run_checks(
    served: list[Any], capsys: pytest.CaptureFixture[str], sink: str
) -> None:
    publish_timeout = 7.0
    floor = publish_timeout + lease_floor_in_help(capsys)[sink]
    argv = [*RUN[:-1], SINKS[sink], "--publish-timeout", f"{publish_timeout:g}"]
    assert cli.main([*argv, "--lease-seconds", f"{floor:g}"]) == 0
    assert cli.main([*argv, "--lease-seconds", f"{floor - 0.5:g}"]) == 2
    assert "--lease-seconds" in capsys.readouterr().err
    assert len(served) == 1


def test_run_sets_the_collectors_young_threshold_before_serving(
    served: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.set_threshold(700, 10, 10)
    seen: list[tuple[int, int, int]] = []
    monkeypatch.setattr(app, "serve", lambda config: _noted(seen, served, config))
    assert cli.main(RUN) == 0
    assert seen == [(app.GC_YOUNG_THRESHOLD, 10, 10)]  # the older generations' thresholds stay


async def _noted(seen: list[tuple[int, int, int]], served: list[Any], config: Any) -> None:
    seen.append(gc.get_threshold())
    served.append(config)


@pytest.fixture(scope="module")
def collector_checked_after_the_module() -> Iterator[None]:
    """Once this module's tests have run and been torn down: the collector is as the tests found it."""
    yield
    assert gc.get_threshold() == THRESHOLDS_BEFORE_THE_TESTS, "a test left run's collector threshold to later tests"


def test_a_run_in_a_test_leaves_the_collector_as_it_found_it(
    collector_checked_after_the_module: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tests that stub serve themselves (test_cli_durations, test_lease) run it: the tests' own fixtures
    restore the collector, whichever stub they use, or every later test runs under run's threshold."""
    served: list[Any] = []
    monkeypatch.setattr(app, "serve", lambda config: _noted([], served, config))
    assert cli.main(RUN) == 0
    assert served and gc.get_threshold()[0] == app.GC_YOUNG_THRESHOLD
