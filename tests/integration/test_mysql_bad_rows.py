"""Rows MySQL or MariaDB take that no event can be made of: dead-lettered at their claim, the rest flowing.

``key`` and ``idempotency_key`` are VARBINARY, so a writer whose connection is
not UTF-8 stores bytes that are not text; MariaDB's JSON check takes some text
no JSON parser does. Each such row must end as a dead letter with a clear
error that parks its key, never as a crashed relay or a batch of innocent
events dead-lettered after it.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from relay.config import TableName
from relay.store.base import DeadEvent, Skipped
from relay.store.mysql import MySQLAdmin, MySQLStore
from tests import mysql_support
from tests.acceptance.cli import cli
from tests.integration.kafka_support import consume, unique_topic
from tests.relay_support import RelayThread, wait_until

#: Keys that are not UTF-8: a stray byte, Latin-1 text, a cut sequence, an encoded surrogate, an overlong form.
BAD_KEYS = [b"\xffA", "café".encode("latin-1"), b"\xe2\x82", b"\xed\xa0\x80", b"ok\xc0\xaf"]
BAD_IDEMPOTENCY_KEYS = [b"\xfe", "idem-é".encode("latin-1")]
#: Text MariaDB's JSON_VALID takes and JSON does not.
LAX_JSON = ['{"a":1e}', '{"a":-}', '{"a":1.}', '{"a":"\\q"}', '{"a":1.e5}', "[-]", "1."]

#: skip's grace in these tests: the relays' --publish-timeout of 30 s, and 10 s.
GRACE_SECONDS = 40

INSERT = "INSERT INTO outbox (topic, `key`, payload, idempotency_key, headers) VALUES (%s, %s, %s, %s, %s)"


def rows(topic: str) -> tuple[list[tuple[object, ...]], dict[str, str], set[str], set[str]]:
    """Each bad row, with an event of its key after it (parked behind it) and, where its key is
    text, one before it (sent); and an event without a key beside each (sent).

    Returns the rows in insert order, what each bad row's error must say (by
    its idempotency key, read as Latin-1), and the idempotency keys that must
    arrive and that must wait.
    """
    cases: list[tuple[bytes | str | None, str, bytes | str, str, str]] = []
    for n, bad_key in enumerate(BAD_KEYS):
        cases.append((bad_key, "{}", f"bad-key-{n}", "{}", "key is not valid UTF-8"))
    for n, bad_idem in enumerate(BAD_IDEMPOTENCY_KEYS):
        cases.append((f"k-idem-{n}", "{}", bad_idem, "{}", "idempotency_key is not valid UTF-8"))
    for n, huge in enumerate(['{"a":1e400}', '{"a":[1,-1e999]}', '{"a":{"b":1e309}}']):
        cases.append((f"k-huge-{n}", "{}", f"bad-huge-{n}", huge, "is a number JSON cannot carry"))
    for n, text in enumerate(LAX_JSON):
        if text.startswith("{"):
            cases.append((f"k-headers-{n}", "{}", f"bad-headers-{n}", text, "headers are not valid JSON"))
        cases.append((f"k-payload-{n}", text, f"bad-payload-{n}", "{}", "payload is not valid JSON"))
        cases.append((None, text, f"bad-null-key-payload-{n}", "{}", "payload is not valid JSON"))
    written: list[tuple[object, ...]] = []
    bad: dict[str, str] = {}
    sent: set[str] = set()
    parked: set[str] = set()
    for n, (key, payload, idem, headers, error) in enumerate(cases):
        if isinstance(key, str):
            written.append((topic, key, json.dumps({"n": n, "at": "before"}), f"before-{n}", "{}"))
            sent.add(f"before-{n}")
        written.append((topic, key, payload, idem, headers))
        bad[idem if isinstance(idem, str) else idem.decode("latin-1")] = error
        if key is not None:
            written.append((topic, key, json.dumps({"n": n, "at": "after"}), f"after-{n}", "{}"))
            parked.add(f"after-{n}")
        written.append((topic, None, json.dumps({"n": n, "at": "free"}), f"free-{n}", "{}"))
        sent.add(f"free-{n}")
    return written, bad, sent, parked


@pytest.mark.timeout(120)
def test_rows_no_event_can_be_made_of_are_dead_lettered_and_the_rest_flows(
    mysql_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic("bad-rows")
    written, bad, sent, parked = rows(topic)
    mysql_support.insert_many(mysql_url, INSERT, written)
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}", batch_size=7) as relay:
        # Until all that can go went: the topic then exists, with every partition, for the consumer.
        settled = {"failed": len(bad), "pending": len(parked)}
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == settled, timeout=60)
        received = consume(kafka_bootstrap, topic, count=len(sent), settle_seconds=1.0)
        assert relay.error is None and relay.relay is not None
        assert relay.relay.metrics.dead_lettered._value.get() == len(bad)
    assert {m.headers["idempotency-key"].decode() for m in received} == sent
    state = {
        idem.decode("latin-1"): (state, error)
        for idem, state, error in mysql_support.execute(
            mysql_url, "SELECT idempotency_key, state, last_error FROM outbox"
        )
    }
    for idem, wanted in bad.items():
        assert state[idem][0] == "failed" and wanted in state[idem][1], (idem, state[idem])
    assert "(its bytes in hex: ff41)" in state["bad-key-0"][1]
    assert {idem for idem, (s, _) in state.items() if s == "pending"} == parked


def test_the_admin_commands_show_bad_bytes_and_lax_json_without_failing(mysql_url: str) -> None:
    mysql_support.insert_many(
        mysql_url,
        INSERT,
        [("t", b"\xffA", "{}", b"idem-\xe9", '{"h":1e}'), ("t", "fine", "[-]", "ok", "{}")],
    )
    mysql_support.execute(mysql_url, "UPDATE outbox SET state = 'failed', last_error = 'x'")
    admin = MySQLAdmin(mysql_url, TableName.parse("outbox"))

    async def look() -> tuple[list[DeadEvent], dict[str, object] | None]:
        await admin.open()
        try:
            return list(await admin.dead()), await admin.inspect(1)
        finally:
            await admin.close()

    dead, row = asyncio.run(look())
    # The key's bad bytes kept (as lone surrogates): the CLI shows such a key in hex, as --key-hex takes it.
    assert [(d.key, d.idempotency_key) for d in dead] == [("\udcffA", "idem-\\xe9"), ("fine", "ok")]
    assert row is not None and row["key"] == "\udcffA" and row["headers"] == '{"h":1e}'
    for command in (["dead"], ["dead", "--json"], ["inspect", "1"], ["inspect", "1", "--json"], ["inspect", "2"]):
        result = cli(*command, "--database-url", mysql_url)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
    assert "\tkey_hex=ff41\t" in cli("dead", "--database-url", mysql_url).stdout


@pytest.mark.parametrize("zero", ["0000-00-00 00:00:00", "2026-00-10 00:00:00", "2026-02-00 12:00:00"])
def test_a_zero_created_at_is_dead_lettered_and_its_key_parks(mysql_url: str, kafka_bootstrap: str, zero: str) -> None:
    topic = unique_topic("zero-date")
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")  # as a writer with MariaDB's older defaults
            cur.executemany(
                "INSERT INTO outbox (topic, `key`, payload, idempotency_key, created_at) VALUES (%s, %s, %s, %s, %s)",
                [
                    (topic, "k", "{}", "first", "2026-01-01 00:00:00"),
                    (topic, "k", "{}", "zero", zero),
                    (topic, "k", "{}", "after", "2026-01-01 00:00:00"),
                    (topic, None, "{}", "free", "2026-01-01 00:00:00"),
                ],
            )
    finally:
        conn.close()
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}") as relay:
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {"failed": 1, "pending": 1}, timeout=30)
        received = consume(kafka_bootstrap, topic, count=2, settle_seconds=1.0)
        assert relay.error is None
    assert {m.headers["idempotency-key"] for m in received} == {b"first", b"free"}
    [(state, error)] = mysql_support.execute(
        mysql_url, "SELECT state, last_error FROM outbox WHERE idempotency_key = 'zero'"
    )
    assert state == "failed" and "created_at is not a date" in error
    assert mysql_support.execute(mysql_url, "SELECT state FROM outbox WHERE idempotency_key = 'after'") == [
        ("pending",)
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("digits", [4301, 5000, 20000])
def test_json_with_integers_past_python_s_digit_limit_is_delivered(
    mysql_url: str, kafka_bootstrap: str, digits: int
) -> None:
    """JSON sets no limit on a number's digits; Python's int() does (4,300): valid JSON is no dead letter."""
    topic = unique_topic("long-ints")
    number = "7" * digits
    written = [
        (topic, "k", f'{{"n":{number}}}', "payload", "{}"),
        (topic, "k", '{"after": 1}', "after", "{}"),
        (topic, "h", "{}", "header", f'{{"n":{number}}}'),
    ]
    mysql_support.insert_many(mysql_url, INSERT, written)
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}") as relay:
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {}, timeout=60)
        received = consume(kafka_bootstrap, topic, count=3, settle_seconds=0.5)
        assert relay.error is None
    by_key = {m.headers["idempotency-key"].decode(): m for m in received}
    assert set(by_key) == {"payload", "after", "header"}
    assert by_key["payload"].value == f'{{"n":{number}}}'.encode()
    assert by_key["header"].headers["n"] == number.encode()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["end", "start", "middle"])
def test_a_topic_with_a_nul_is_dead_lettered_by_the_kafka_sink_and_the_relay_stays_up(
    mysql_url: str, kafka_bootstrap: str, where: str
) -> None:
    """MySQL's topic column takes a NUL; the Kafka client refuses such a topic name before
    anything is sent (it raised ValueError, which stopped the relay: a crash loop on restart)."""
    topic = unique_topic("nul-topic")
    bad = {"end": topic + "\x00", "start": "\x00" + topic, "middle": topic[:5] + "\x00" + topic[5:]}[where]
    written = [
        (topic, "k", "{}", "first", "{}"),
        (bad, "k", "{}", "nul", "{}"),
        (topic, "k", "{}", "after", "{}"),
        (topic, "j", "{}", "other", "{}"),
        (topic, None, "{}", "free", "{}"),
    ]
    mysql_support.insert_many(mysql_url, INSERT, written)
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}") as relay:
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {"failed": 1, "pending": 1}, timeout=30)
        received = consume(kafka_bootstrap, topic, count=3, settle_seconds=1.0)
        assert relay.error is None
    assert {m.headers["idempotency-key"] for m in received} == {b"first", b"other", b"free"}
    [(state, attempts, error)] = mysql_support.execute(
        mysql_url, "SELECT state, attempts, last_error FROM outbox WHERE idempotency_key = 'nul'"
    )
    assert state == "failed" and attempts == 1, (state, attempts, error)
    assert "topic" in error and "NUL" in error, error
    assert mysql_support.execute(mysql_url, "SELECT state FROM outbox WHERE idempotency_key = 'after'") == [
        ("pending",)
    ]


@pytest.mark.timeout(120)
def test_lax_json_in_one_hot_key_inline_and_multi_mb_is_dead_lettered_and_only_its_key_parks(
    mysql_url: str, kafka_bootstrap: str
) -> None:
    """The payload check that runs beside the lease, on the other inputs of its class: one hot key whose bad
    payloads are small (checked with the claim's rows) and multi-MB (read after the locking read), and many
    keys flowing beside it."""
    topic = unique_topic("bad-hot")
    big_lax = '{"pad":"' + "x" * (3 * 1024 * 1024) + '","a":1e}'
    written: list[tuple[object, ...]] = [(topic, "hot", json.dumps({"n": 0}), "hot-0", "{}")]
    written += [(topic, "hot", big_lax, "hot-bad-big", "{}"), (topic, "hot", json.dumps({"n": 1}), "hot-1", "{}")]
    written += [(topic, f"k-{n}", json.dumps({"n": n}), f"free-{n}", "{}") for n in range(200)]
    written += [(topic, "hot2", json.dumps({"n": 0}), "hot2-0", "{}"), (topic, "hot2", '{"a":-}', "hot2-bad", "{}")]
    written += [(topic, "hot2", json.dumps({"n": 1}), "hot2-1", "{}")]
    mysql_support.insert_many(mysql_url, INSERT, written)
    sent = {"hot-0", "hot2-0"} | {f"free-{n}" for n in range(200)}
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}", batch_size=50) as relay:
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {"failed": 2, "pending": 2}, timeout=60)
        received = consume(kafka_bootstrap, topic, count=len(sent), settle_seconds=1.0)
        assert relay.error is None
    assert {m.headers["idempotency-key"].decode() for m in received} == sent
    state = {
        idem.decode(): (state, error)
        for idem, state, error in mysql_support.execute(
            mysql_url, "SELECT idempotency_key, state, last_error FROM outbox"
        )
    }
    assert state["hot-bad-big"][0] == "failed" and "payload is not valid JSON" in state["hot-bad-big"][1]
    assert state["hot2-bad"][0] == "failed" and "payload is not valid JSON" in state["hot2-bad"][1]
    assert state["hot-1"][0] == state["hot2-1"][0] == "pending"  # parked behind their dead letters


@pytest.mark.parametrize("ended_ago", [0.5, None])
def test_a_bad_row_taken_over_from_an_ended_lease_is_skipped_only_after_the_grace(
    mysql_url: str, ended_ago: float | None
) -> None:
    # A relay of other settings made an event of the row and stalled past its lease (or no relay ever
    # leased it: None). This claim finds no event in it and dead-letters it; skip must still wait out the
    # grace from the first relay's lease end, which may still be publishing it, before "next" may go.
    table = TableName.parse("outbox")
    mysql_support.insert_many(mysql_url, INSERT, [("t", "k", "[-]", "bad", "{}"), ("t", "k", "{}", "next", "{}")])
    if ended_ago is not None:
        mysql_support.execute(
            mysql_url,
            "UPDATE outbox SET attempts = 1, claim_token = 'other', lease_owner = 'other',"
            " lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND WHERE idempotency_key = 'bad'",
            [round(ended_ago * 1e6)],
        )
    store, admin = MySQLStore(mysql_url, table, owner="test", lease_seconds=30), MySQLAdmin(mysql_url, table)

    async def go() -> tuple[int, Skipped, Skipped]:
        await store.open()
        await admin.open()
        try:
            claim = await store.claim(10, max_attempts=5)
            (bad,) = [d.id for d in await admin.dead()]
            refused = await admin.skip(bad, lease_grace_seconds=GRACE_SECONDS)
            mysql_support.execute(
                mysql_url,
                "UPDATE outbox SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL %s SECOND"
                " WHERE id = %s AND lease_expires_at <> '1000-01-01 00:00:00'",
                [GRACE_SECONDS + 1, bad],
            )
            return claim.buried, refused, await admin.skip(bad, lease_grace_seconds=GRACE_SECONDS)
        finally:
            await admin.close()
            await store.close()

    buried, first, after_grace = asyncio.run(go())
    assert buried == 1
    assert first is (Skipped.IN_FLIGHT if ended_ago is not None else Skipped.SKIPPED)
    assert after_grace is (Skipped.SKIPPED if ended_ago is not None else Skipped.NOT_FOUND)
