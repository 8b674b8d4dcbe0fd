"""Named queries as the PostgreSQL store sends them: ``$n`` placeholders, parameters in their order."""

from __future__ import annotations

import re

import pytest
from psycopg import sql

from relay.config import TableLayout, TableName
from relay.store import sql as named
from relay.store.postgres.connection import Statement


def test_each_name_takes_one_number_in_the_order_it_first_appears() -> None:
    query = sql.SQL("SELECT %(b)s, %(a)s FROM {t} WHERE x = %(b)s AND y = ANY(%(c)s::text[])").format(
        t=sql.Identifier("my_schema", "outbox")
    )
    statement = Statement.of(query)
    assert statement.text == b'SELECT $1, $2 FROM "my_schema"."outbox" WHERE x = $1 AND y = ANY($3::text[])'
    assert statement.names == ("b", "a", "c")
    assert statement.values({"a": 1, "b": 2, "c": ["x"], "unused": 4}) == [2, 1, ["x"]]


def test_a_statement_without_parameters_is_sent_without_any() -> None:
    statement = Statement.of(sql.SQL("SELECT 1 FROM {t}").format(t=sql.Identifier("outbox")))
    assert statement.names == () and statement.values(None) is None and statement.values({"a": 1}) is None


@pytest.mark.parametrize("text", ["SELECT %s", "SELECT 100 %% 7", "SELECT %(a)b", "SELECT '%'"])
def test_a_percent_that_is_no_named_placeholder_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="no %\\(name\\)s placeholder"):
        Statement.of(sql.SQL(text).format())


def test_a_missing_parameter_is_a_key_error_naming_it() -> None:
    statement = Statement.of(sql.SQL("SELECT %(a)s, %(b)s").format())
    with pytest.raises(KeyError, match="b"):
        statement.values({"a": 1})


@pytest.mark.parametrize("layout", ["native", "debezium"])
@pytest.mark.parametrize("table", ["outbox", "app.events_2026"])
def test_every_named_query_converts_with_every_placeholder_numbered(layout: str, table: str) -> None:
    relation = TableLayout.parse(layout).relation(TableName.parse(table))
    for name, text in named.queries().items():
        statement = Statement.of(named.render(text, relation))
        assert b"%" not in statement.text, name
        numbers = {int(n) for n in re.findall(rb"\$(\d+)", statement.text)}
        assert numbers == set(range(1, len(statement.names) + 1)), name
        assert sorted(statement.names) == sorted(set(re.findall(r"%\((\w+)\)s", text))), name
