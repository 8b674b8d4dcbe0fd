"""The MySQL adapter's pure parts: URLs, error translation, the binlog check, runs and the byte cap."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime
from uuid import uuid4

import pymysql
import pytest
from asyncmy import errors as my_errors

from relay.config import TableName
from relay.errors import ConfigError, SchemaError, StoreError, StoreReadOnly, StoreUnavailable
from relay.store.mysql import BinlogUnsafe, MySQLAdmin, Target, check_binlog, connection
from relay.store.mysql.connection import Database, session_settings, translate
from relay.store.mysql.rows import Leased, event, payload_problem, unusable
from relay.store.mysql.runs import Candidate, Tail, Unsent, lone_runs, runs, within_bytes
from relay.store.mysql.sql import identifiers, queries, statements

URL = "mysql://app:s3cr%40t@db.example:3307/shop"
TABLE = TableName.parse("outbox")


def test_a_url_names_host_port_user_database_and_keeps_the_password_out_of_the_repr() -> None:
    target = Target.parse(URL)
    assert (target.host, target.port, target.user, target.database, target.password) == (
        "db.example",
        3307,
        "app",
        "shop",
        "s3cr@t",
    )
    assert "s3cr" not in repr(target)
    assert Target.parse("mariadb://db/x").port == 3306
    assert "s3cr" not in repr(MySQLAdmin(URL, TABLE))


@pytest.mark.parametrize(
    "url", ["mysql://app:s3cr3t@db.example", "mysql://app:s3cr3t@/shop", "mysql://app:s3cr3t@h/shop?ssl=1"]
)
def test_a_url_without_host_or_database_or_with_options_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        Target.parse(url)
    assert "s3cr3t" not in str(info.value)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (1146, SchemaError),
        (1054, SchemaError),
        (1290, StoreReadOnly),
        (1792, StoreReadOnly),
        (1836, StoreReadOnly),
        (1213, StoreUnavailable),
        (1205, StoreUnavailable),
        (2013, StoreUnavailable),
        (2006, StoreUnavailable),
        (4031, StoreUnavailable),
        (1064, StoreError),
    ],
)
def test_driver_errors_become_the_relays_own_without_the_password(code: int, kind: type[StoreError]) -> None:
    error_class = my_errors.OperationalError if code >= 2000 or code in (1213, 1205) else my_errors.ProgrammingError
    translated = translate(error_class(code, f"failed at {URL}"), URL, TABLE)
    assert type(translated) is kind
    assert "s3cr" not in str(translated)


@pytest.mark.parametrize(
    ("code", "setting"), [(1969, "MariaDB max_statement_time"), (3024, "MySQL max_execution_time")]
)
@pytest.mark.parametrize("driver", [my_errors.OperationalError, pymysql.OperationalError])
def test_a_statement_stopped_at_its_timeout_says_so(code: int, setting: str, driver: type[Exception]) -> None:
    """MariaDB's kill at max_statement_time was reported as "the database did not answer"."""
    said = "Query execution was interrupted (max_statement_time exceeded)"
    translated = translate(driver(code, said), URL, TABLE)
    assert type(translated) is StoreUnavailable
    assert "statement timeout" in str(translated) and f"{setting} exceeded, error {code}" in str(translated)
    assert "did not answer" not in str(translated)


def test_a_call_given_up_names_the_statement_timeout_it_waited_past(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "CALL_MARGIN_SECONDS", 0.05)

    async def frozen() -> None:
        database = Database(URL, TABLE, connect_timeout=1, statement_timeout=0.05)
        async with database.deadline():
            await asyncio.sleep(5)

    with pytest.raises(StoreUnavailable) as given_up:
        asyncio.run(frozen())
    assert "did not answer within 0.1s (the statement timeout, 0.05s, and a margin)" in str(given_up.value)


def test_statement_based_binary_logging_is_refused_and_mixed_warned_about() -> None:
    assert check_binlog(0, "STATEMENT") is None  # no binary log: nothing replicates
    assert check_binlog(1, "ROW") is None
    assert "MIXED" in (check_binlog(1, "MIXED") or "")
    with pytest.raises(BinlogUnsafe, match="binlog_format=ROW"):
        check_binlog("1", "STATEMENT")


def test_sessions_are_read_committed_in_utc_with_each_servers_timeout() -> None:
    maria, mysql = (
        session_settings(mariadb=True, statement_timeout=2.5),
        session_settings(mariadb=False, statement_timeout=2.5),
    )
    for settings in (maria, mysql):
        assert "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED" in settings
        assert "SET SESSION time_zone = '+00:00'" in settings
    assert "SET SESSION max_statement_time = 2.500" in maria
    assert "SET SESSION max_execution_time = 2500" in mysql


def test_identifiers_are_backticked_and_every_query_quotes_the_key_column() -> None:
    ids = identifiers(TableName.parse("events.outbox"))
    assert ids["table"] == "`events`.`outbox`"
    assert ids["version_table"] == "`events`.`outbox_schema_version`"
    for name, text in queries().items():
        assert " key " not in f" {text} ".replace("\n", " ").lower().replace(".`key`", ""), name
    assert statements("SELECT 1;\n-- a comment\nSELECT 2; -- trailing\n") == ["SELECT 1", "SELECT 2"]


def c(id: int, key: str | None, topic: str = "t", bytes: int = 10, *, head: bool = False) -> Candidate:
    return Candidate(id, key, topic, 0, bytes, False, head)


def test_a_run_starts_at_the_keys_oldest_unsent_event_and_stops_at_a_gap_or_another_topic() -> None:
    candidates = [c(1, "k", head=True), c(2, "k"), c(4, "k"), c(5, "j", head=True), c(6, "j", "other"), c(7, None)]
    unsent = {
        "k": [Unsent(1, "t"), Unsent(2, "t"), Unsent(3, "t"), Unsent(4, "t")],
        "j": [Unsent(5, "t"), Unsent(6, "other")],
    }
    assert runs(candidates, unsent, {}, set()) == {1: False, 2: True, 5: False, 7: False}
    # The oldest unsent is not a candidate (another claim holds it): the key waits.
    assert runs([c(2, "k")], {"k": [Unsent(1, "t"), Unsent(2, "t")]}, {}, set()) == {}
    # The oldest unsent that was read is a candidate, but the locking read saw an older one: the key waits.
    assert runs([c(2, "k")], {"k": [Unsent(2, "t")]}, {}, set()) == {}
    assert runs([c(2, "k", head=True)], {"k": [Unsent(2, "t")]}, {}, set()) == {2: False}


def test_a_key_in_flight_here_goes_on_after_its_tail_only_while_the_tail_holds_and_on_its_topic() -> None:
    unsent = {"k": [Unsent(1, "t"), Unsent(2, "t"), Unsent(3, "t")]}
    tails = {"k": Tail(2, "t")}
    assert runs([c(3, "k")], unsent, tails, {2}) == {3: True}
    assert runs([c(3, "k")], unsent, tails, set()) == {}
    assert runs([c(3, "k", "b")], {"k": [Unsent(1, "t"), Unsent(2, "t"), Unsent(3, "b")]}, tails, {2}) == {}


def test_lone_candidates_and_the_keys_read_without_their_topics_choose_the_runs_from_every_unsent_event() -> None:
    # lone_runs (from the heads and the event after each tail), when it answers, must choose what the runs
    # over the keys' unsent events do; and the claim reads the keys' unsent events without their topics and
    # from its first keyed candidate or tail on (claim_keys), which must not change the runs.
    rng = random.Random(17)
    answered = 0
    for _ in range(3000):
        unsent: dict[str, list[Unsent]] = {}
        candidates: list[Candidate] = []
        low = rng.choice([1, 1, -1, -7])  # plain SQL may write ids below 1
        for id in range(low, low + rng.randint(1, 13)):
            key = rng.choice(["a", "b", "c", "d", "e", "f", None])
            topic = rng.choice(["t", "t", "t", "u"])
            if key is not None:
                unsent.setdefault(key, []).append(Unsent(id, topic))
            if key is None or rng.random() < 0.7 or id < low + 2:
                head = key is not None and unsent[key][0].id == id
                candidates.append(Candidate(id, key, topic, 0, 1, False, head))
        upto = max((x.id for x in candidates), default=0)
        seen = {key: [e for e in events if e.id <= upto] for key, events in unsent.items()}
        tails = {
            key: Tail(rng.choice(events).id, rng.choice("tu"))
            for key, events in seen.items()
            if events and rng.random() < 0.2
        }
        flying = {tail.id for tail in tails.values() if rng.random() < 0.7}
        expected = runs(candidates, seen, tails, flying)
        topics = {x.id: x.topic for x in candidates}
        # claim_keys reads from the first keyed candidate, or a tail of a candidate's key if earlier.
        keys = {x.key for x in candidates if x.key is not None}
        first = min(
            [x.id for x in candidates if x.key is not None] + [t.id for k, t in tails.items() if k in keys], default=0
        )
        read = {
            key: [Unsent(e.id, topics.get(e.id, "")) for e in events if e.id >= first] for key, events in seen.items()
        }
        assert runs(candidates, read, tails, flying) == expected
        after = {
            t.id: next((e.id for e in unsent[k] if e.id > t.id), 2**63 - 1) for k, t in tails.items() if t.id in flying
        }
        chosen = lone_runs(candidates, tails, flying, after)
        if chosen is not None:
            answered += 1
            assert chosen == expected
    assert answered > 300


def test_lone_candidates_go_from_their_keys_head_or_right_after_their_tail_in_flight_and_on_its_topic() -> None:
    lone = [Candidate(1, "k", "t", 0, 1, False, True), Candidate(2, None, "t", 0, 1, False)]
    assert lone_runs(lone, {}, set(), {}) == {1: False, 2: False}
    assert lone_runs([*lone, Candidate(3, "k", "t", 0, 1, False)], {}, set(), {}) is None
    assert lone_runs([Candidate(3, "k", "t", 0, 1, False)], {}, set(), {}) == {}
    after = [Candidate(5, "k", "t", 0, 1, False)]
    tails = {"k": Tail(4, "t")}
    assert lone_runs(after, tails, {4}, {4: 5}) == {5: True}
    assert lone_runs(after, tails, set(), {}) == {}  # the tail's lease ended
    assert lone_runs(after, tails, {4}, {4: 3}) == {}  # another event comes first
    assert lone_runs(after, {"k": Tail(4, "u")}, {4}, {4: 5}) == {}  # another topic


def test_the_byte_cap_keeps_at_least_one_and_cuts_a_run_never_holes_it() -> None:
    assert [x.id for x in within_bytes([c(1, None, bytes=500)], 1)] == [1]
    placed = [c(1, "k", bytes=100), c(2, None, bytes=100), c(3, "k", bytes=100)]
    assert [x.id for x in within_bytes(placed, 150)] == [1, 2]
    assert [x.id for x in within_bytes(placed, None)] == [1, 2, 3]


@pytest.mark.parametrize("payload", ['{"a": "\u00e9"}', '{"a": "\u00e9"}'.encode(), bytearray(b'{"a": 1}')])
def test_a_json_payload_given_as_text_or_bytes_becomes_the_same_utf8(payload: str | bytes) -> None:
    row = {"id": 1, "topic": "t", "key": None, "payload": payload, "payload_bytes": None, "headers": "{}",
           "idempotency_key": b"i", "created_at": datetime(2026, 1, 1), "content_type": None}  # fmt: skip
    assert unusable(row, check_payload=True) is None
    built = event(row, chained=False, attempts=1)
    assert built.payload == (payload.encode() if isinstance(payload, str) else bytes(payload))


@pytest.mark.parametrize(
    "payload",
    [
        '{"a": [1, 2.5, "x", true, null]}',
        ' \t\n{"a": 1} \r\n',
        "[]",
        "3",
        '"\\ud800"',
        "NaN",
        "1" * 5000,
        '{"a": ' + "9" * 5000 + "}",
        "",
        "   ",
        '{"a":1e}',
        "[-]",
        '"\\q"',
        '{"a": 1} x',
        '{"a": 1}{}',
        "[1,]",
        '{"a": 1',
    ],
)
def test_a_mariadb_payload_passes_the_claims_check_exactly_when_json_loads_takes_it(payload: str) -> None:
    # The check calls json.loads' scanner itself (rows.payload_problem): the same texts pass, with the
    # same errors for those that do not; digits past int()'s limit are JSON too.
    try:
        json.loads(payload, parse_int=lambda digits: 0)
        expected = None
    except ValueError as exc:
        expected = f"payload is not valid JSON, though the database took it: {exc}"
    assert payload_problem(payload) == expected
    assert payload_problem(payload.encode()) == expected


def test_a_claim_of_one_priority_gives_its_events_in_id_order_and_of_several_by_priority_each_key_in_order() -> None:
    def claim(priorities: dict[int, int], keys: dict[int, str | None]) -> list[int]:
        rows = {
            i: {"id": i, "topic": "t", "key": keys[i], "priority": priority, "payload": "{}", "payload_bytes": None,
                "headers": "{}", "idempotency_key": f"i{i}".encode(), "created_at": datetime(2026, 1, 1),
                "content_type": None, "attempts": 0}
            for i, priority in priorities.items()
        }  # fmt: skip
        for row in rows.values():
            assert unusable(row, check_payload=True) is None
        # Placed out of id order, as the byte cap may leave a claim.
        placed = [(i, False) for i in sorted(rows, key=lambda i: (i % 2, i))]
        return [e.id for e in asyncio.run(Leased(uuid4(), rows, placed, frozenset(), 0).events()).events]

    keys: dict[int, str | None] = {1: "k", 2: None, 3: "k", 4: "j", 5: None, 6: "j"}
    assert claim(dict.fromkeys(keys, 0), keys) == [1, 2, 3, 4, 5, 6]
    # Higher first, but a key's later event at a higher priority keeps its place after its earlier one.
    assert claim({1: 0, 2: 5, 3: 5, 4: 0, 5: 0, 6: 0}, keys) == [2, 1, 3, 4, 5, 6]


def test_a_claims_events_carry_each_rows_own_creation_time_as_utc() -> None:
    # The events of one claim make each created_at aware once per run of equal values (rows.Leased.events).
    times = [datetime(2026, 1, 1), datetime(2026, 1, 1), datetime(2026, 1, 2), datetime(2026, 1, 1, 0, 0, 0, 1)]
    rows = {
        i: {
            "id": i,
            "topic": "t",
            "key": None,
            "priority": 0,
            "payload": "{}",
            "payload_bytes": None,
            "headers": '{"h": "v"}' if i == 2 else "{}",
            "idempotency_key": f"i{i}".encode(),
            "created_at": at,
            "content_type": None,
            "attempts": 0,
        }
        for i, at in enumerate(times)
    }
    for row in rows.values():
        assert unusable(row, check_payload=True) is None
    claim = asyncio.run(Leased(uuid4(), rows, [(i, False) for i in rows], frozenset(), 0).events())
    assert [e.created_at for e in claim.events] == [at.replace(tzinfo=UTC) for at in times]
    assert [e.headers for e in claim.events] == [{}, {}, {"h": "v"}, {}]
    assert [e.idempotency_key for e in claim.events] == ["i0", "i1", "i2", "i3"]


def test_alongside_runs_the_work_while_the_statement_waits_and_cancels_the_statement_with_the_call() -> None:
    log: list[str] = []
    answer = asyncio.Event()

    async def statement() -> None:
        log.append("sent")
        await answer.wait()
        log.append("answered")

    def work() -> int:
        log.append("work")
        answer.set()
        return 7

    assert asyncio.run(connection.alongside(statement(), work)) == 7
    assert log == ["sent", "work", "answered"]
    assert asyncio.run(connection.alongside(None, lambda: 8)) == 8

    async def cancelled() -> bool:
        never = asyncio.Event()
        waiting = asyncio.ensure_future(never.wait())
        call = asyncio.ensure_future(connection.alongside(waiting, lambda: None))
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return waiting.cancelled()

    assert asyncio.run(cancelled())
