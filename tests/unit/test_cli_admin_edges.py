"""The operator's commands at their edges, on the memory store: dry runs, progress, an interrupt,
output that agrees with the exit code, times given as durations, and keys shown as they select.

No server is reached: the commands' ``Admin`` is a ``MemoryStore``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relay import cli
from relay.cli import admin
from relay.cli.admin import shown_key
from relay.store import batches
from relay.store.base import RequeueFilter, key_bytes
from relay.store.memory import MemoryStore

URL = ["--database-url", "postgresql://app@127.0.0.1:1/shop"]


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryStore]:
    memory = MemoryStore()
    monkeypatch.setattr(admin, "_admin", lambda args: memory)
    yield memory


def dead(store: MemoryStore, *events: tuple[str, str | None], ago: float = 0) -> list[int]:
    """Dead-letter events of (topic, key), failed ``ago`` seconds back; their ids."""
    ids = []
    for topic, key in events:
        row = store.rows[store.insert(topic, {}, key=key)]
        row.state, row.failed_at, row.last_error, row.attempts = "failed", store.now() - timedelta(seconds=ago), "x", 3
        ids.append(row.id)
    return ids


def sent(store: MemoryStore, ago: float, key: str | None = None) -> int:
    row = store.rows[store.insert("t", {}, key=key)]
    row.state, row.published_at = "sent", store.now() - timedelta(seconds=ago)
    return row.id


def states(store: MemoryStore) -> dict[int, str]:
    return {row.id: row.state for row in store.rows.values()}


def main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main([*argv, *URL])
    out, err = capsys.readouterr()
    return code, out, err


# -- dry runs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["requeue", "--all"], [1, 2, 3]),
        (["requeue", "--topic", "billing"], [3]),
        (["requeue", "--key", "k"], [1, 2]),
        (["requeue", "--id", "2"], [2]),
        (["replay", "--all"], [4, 5]),
        (["replay", "--since", "1h"], [5]),
        (["replay", "--until", "1h"], [4]),
        (["skip", "--id", "3"], [3]),
    ],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_dry_run_says_what_would_change_and_changes_nothing(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], argv: list[str], expected: list[int], as_json: bool
) -> None:
    dead(store, ("orders", "k"), ("orders", "k"), ("billing", None))
    sent(store, ago=7200)
    sent(store, ago=60)
    before = {row.id: (row.state, row.attempts, row.deliver_at, row.failed_at) for row in store.rows.values()}
    code, out, err = main(capsys, *argv, "--dry-run", *(["--json"] if as_json else []))
    assert code == 0, err
    verb = argv[0]
    if as_json:
        assert json.loads(out) == {"dry_run": True, f"would_{verb}": len(expected), "ids": expected}
    else:
        assert out == f"would {verb} {len(expected)} events (dry run: nothing changed)\n"
    assert {row.id: (row.state, row.attempts, row.deliver_at, row.failed_at) for row in store.rows.values()} == before


def test_purge_dry_run_counts_and_changes_nothing(store: MemoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    for ago in (10, 7200, 9000):
        sent(store, ago)
    code, out, _ = main(capsys, "purge", "--older-than", "1h", "--dry-run", "--json")
    assert code == 0 and json.loads(out) == {"dry_run": True, "would_purge": 2}
    assert len(store.rows) == 3
    assert main(capsys, "purge", "--older-than", "1h")[1] == "purged 2 events\n"


def test_a_dry_runs_json_lists_a_bounded_sample(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin, "DRY_RUN_IDS", 3)
    ids = dead(store, *[("t", None)] * 7)
    code, out, _ = main(capsys, "requeue", "--all", "--dry-run", "--json")
    assert code == 0 and json.loads(out) == {"dry_run": True, "would_requeue": 7, "ids": ids[:3]}


@pytest.mark.parametrize("state", ["pending", "in flight", "sent", "skipped", None])
def test_a_refused_dry_run_skip_or_requeue_by_id_fails_as_the_real_one(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], state: str | None
) -> None:
    if state is not None:
        row = store.rows[store.insert("t", {})]
        row.state = "pending" if state == "in flight" else state
        if state == "in flight":
            row.lease_expires_at = store.now() + timedelta(seconds=30)
    commands = ["requeue"] if state == "pending" else ["skip", "requeue"]  # skip takes a waiting event
    for command in commands:
        real = main(capsys, command, "--id", "1")
        assert real[:2] == (1, ""), (command, real)
        assert main(capsys, command, "--id", "1", "--dry-run") == real


# -- output and exit codes -----------------------------------------------------------


@pytest.mark.parametrize("state", ["pending", "sent", "skipped", None])
def test_requeue_of_one_event_that_is_not_dead_prints_only_the_error(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], state: str | None
) -> None:
    """It printed "requeued 0 events" on stdout and an error on stderr, and exited 1."""
    if state is not None:
        store.rows[store.insert("t", {})].state = state
    code, out, err = main(capsys, "requeue", "--id", "1")
    assert (code, out) == (1, "")
    assert err.strip().splitlines() == ["outbox-relay: error: event 1 is not dead-lettered (or does not exist)"]
    code, out, err = main(capsys, "requeue", "--id", "1", "--json")
    assert code == 1 and json.loads(out) == {"requeued": []}


# -- batches: progress and an interrupt ------------------------------------------------


def test_progress_is_said_on_stderr_as_batches_commit(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(batches, "ADMIN_BATCH_SIZE", 2)
    dead(store, *[("t", "k")] * 5)
    code, out, err = main(capsys, "requeue", "--all")
    assert (code, out) == (0, "requeued 5 events\n")
    assert err.splitlines() == [f"outbox-relay: requeued {n} events so far" for n in (2, 4, 5)]


class Interrupted(MemoryStore):
    """Ctrl-C after ``batches`` batches of a requeue."""

    def __init__(self, batches: int) -> None:
        super().__init__()
        self.batches = batches

    async def requeue(self, selection: RequeueFilter, **kw: Any) -> list[int]:
        told = kw.pop("progress")
        seen = []

        def progress(count: int) -> None:
            told(count)
            seen.append(count)
            if len(seen) == self.batches:
                raise KeyboardInterrupt

        return await super().requeue(selection, progress=progress, **kw)


def test_an_interrupted_requeue_kept_whole_batches_and_run_again_takes_the_rest(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Interrupted(batches=2)
    monkeypatch.setattr(admin, "_admin", lambda args: store)
    monkeypatch.setattr(batches, "ADMIN_BATCH_SIZE", 3)
    ids = dead(store, *[("t", "k")] * 8)
    code, out, err = main(capsys, "requeue", "--all")
    assert (code, out) == (130, "")
    assert "interrupted after requeued 6 events" in err and "run the command again" in err
    assert [states(store)[i] for i in ids] == ["pending"] * 6 + ["failed"] * 2
    store.batches = 0
    assert main(capsys, "requeue", "--all")[:2] == (0, "requeued 2 events\n")
    assert set(states(store).values()) == {"pending"}


# -- times: an ISO time or a duration, wherever a time is asked --------------------------


@pytest.mark.parametrize("since", ["1m", "90s", "90", "2h", "0.5d", "1w", " 15m "])
def test_replay_since_takes_a_duration_ago(store: MemoryStore, capsys: pytest.CaptureFixture[str], since: str) -> None:
    """replay --since 1m was refused (an ISO time only) while purge --older-than 7d took durations."""
    recent, old = sent(store, ago=20), sent(store, ago=30 * 86400)
    code, out, err = main(capsys, "replay", "--since", since, "--json")
    assert code == 0, err
    assert json.loads(out) == {"replayed": [recent]}
    code, out, err = main(capsys, "replay", "--until", since, "--json")
    assert code == 0 and json.loads(out) == {"replayed": [old]}, err


@pytest.mark.parametrize(
    "form", ["%Y-%m-%dT%H:%M:%S+00:00", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S", "%Y%m%dT%H%M%S"]
)
def test_a_time_is_still_an_iso_time_and_purge_takes_one_too(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    recent, old = sent(store, ago=60), sent(store, ago=3 * 86400)
    cut = (datetime.now(UTC) - timedelta(days=1)).strftime(form)
    code, out, err = main(capsys, "replay", "--until", cut, "--dry-run", "--json")
    assert code == 0 and json.loads(out)["ids"] == [old], err
    code, out, err = main(capsys, "purge", "--older-than", cut, "--json")
    assert code == 0 and json.loads(out) == {"purged": 1}, err
    assert list(store.rows) == [recent]


@pytest.mark.parametrize("value", ["yesterday", "1y", "-1m", "1_000", "2026-13-01", "\u0661\u0660m", "1e3", ""])
@pytest.mark.parametrize("flag", ["--since", "--until"])
def test_a_time_that_is_neither_is_one_line_naming_both_forms(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["replay", f"{flag}={value}", *URL])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"argument {flag}" in line and "ISO-8601 time" in line and "duration" in line, line


def test_purge_refuses_a_time_ahead_of_now(store: MemoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    ahead = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    with pytest.raises(SystemExit):
        cli.main(["purge", "--older-than", ahead, *URL])
    assert "ahead of now" in capsys.readouterr().err


# -- keys shown as they select --------------------------------------------------------

#: Pairs that were shown the same way: bytes that are not UTF-8 (as a MySQL VARBINARY key reads back)
#: or a control character, and the text of their escaped spelling.
TWINS = [
    ("\udce9\udcff", "\\xe9\\xff"),
    ("caf\udce9", "caf\\xe9"),
    ("k\ny", "k\\ny"),
    ("tab\there", "tab\\there"),
    ("\x00", "\\x00"),
    ("\u2028", "\\u2028"),
]


@pytest.mark.parametrize(("odd", "text"), TWINS)
def test_dead_shows_two_keys_two_ways_and_each_shown_form_selects_its_own(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], odd: str, text: str
) -> None:
    """E9 FF and the 8-character text \\xe9\\xff were both shown as \\xe9\\xff: requeue --key copied from
    that output requeued the other event."""
    odd_id, text_id = dead(store, ("t", odd), ("t", text))
    lines = main(capsys, "dead")[1].splitlines()
    shown = {int(line.split("\t")[0]): line.split("\t")[2] for line in lines}
    assert shown[odd_id] == f"key_hex={key_bytes(odd).hex()}" and shown[text_id] == f"key={text}"
    listed = {d["id"]: d for d in json.loads(main(capsys, "dead", "--json")[1])}
    assert (listed[odd_id]["key"], listed[odd_id]["key_hex"]) == (
        None if "\udc00" <= max(odd) <= "\udcff" else odd,
        key_bytes(odd).hex(),
    )
    assert (listed[text_id]["key"], listed[text_id]["key_hex"]) == (text, text.encode().hex())
    inspected = main(capsys, "inspect", str(odd_id))[1]
    assert f"\nkey_hex: {key_bytes(odd).hex()}\n" in inspected
    # Copied back, each shown form selects its own event and no other.
    flag, value = shown[odd_id].split("=", 1)
    code, out, _ = main(capsys, "requeue", f"--{flag.replace('_', '-')}", value, "--json")
    assert code == 0 and json.loads(out) == {"requeued": [odd_id]}
    code, out, _ = main(capsys, "requeue", "--key", shown[text_id].split("=", 1)[1], "--json")
    assert code == 0 and json.loads(out) == {"requeued": [text_id]}


@pytest.mark.parametrize("key", ["k", "", "é", "a b", "\\", "key=x", "\udcff", "\n", "x\u200b"])
def test_a_shown_key_reads_back_as_the_same_key(key: str) -> None:
    name, value = shown_key(key)
    if name == "key":
        assert value == key and value.isprintable()
    else:
        assert bytes.fromhex(value) == key_bytes(key)
        assert key_bytes(bytes.fromhex(value).decode("utf-8", "surrogateescape")) == key_bytes(key)


@pytest.mark.parametrize("value", ["e", "zz", "é", "0x41"])
def test_a_key_hex_that_is_not_hex_is_refused(
    store: MemoryStore, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["requeue", "--key-hex", value, *URL])
    assert exit_.value.code == 2 and "is not hex" in capsys.readouterr().err
