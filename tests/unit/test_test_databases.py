"""The test suite's database stock and dropper (tests.databases): a database per taker, every one dropped."""

from __future__ import annotations

import itertools
import threading

import pytest

from tests.databases import DROP_BATCH, Dropper, Stock


class Server:
    """Databases by name, made and dropped by the stock's and the dropper's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.numbers = itertools.count()
        self.made: list[str] = []
        self.dropped: list[str] = []

    def make(self) -> str:
        with self.lock:
            name = f"db{next(self.numbers)}"
            self.made.append(name)
            return name

    def drop(self, name: str) -> None:
        with self.lock:
            assert name in self.made and name not in self.dropped, name
            self.dropped.append(name)


def test_each_take_is_a_new_database_and_every_database_made_is_dropped_by_the_end() -> None:
    server = Server()
    dropper = Dropper(server.drop)
    stock = Stock(server.make, dropper)
    taken = [stock.take() for _ in range(2 * DROP_BATCH + 3)]
    for name in taken:
        dropper.put(name)
    stock.close()
    dropper.close()
    assert len(set(taken)) == len(taken)
    # The one made ahead and never taken is dropped too.
    assert sorted(server.dropped) == sorted(server.made)
    assert len(server.made) > len(taken)


def test_a_stock_that_is_never_taken_from_makes_nothing() -> None:
    server = Server()
    dropper = Dropper(server.drop)
    Stock(server.make, dropper).close()
    dropper.close()
    assert server.made == []


def test_a_failed_make_fails_the_take_and_a_failed_drop_fails_the_close() -> None:
    def make() -> str:
        raise OSError("server down")

    def drop(name: str) -> None:
        raise OSError(f"cannot drop {name}")

    dropper = Dropper(drop)
    stock = Stock(make, dropper)
    with pytest.raises(RuntimeError, match="making a test database failed") as made:
        stock.take()
    assert isinstance(made.value.__cause__, OSError)
    stock.close()
    dropper.put("db0")
    with pytest.raises(RuntimeError, match="dropping a test database failed"):
        dropper.close()
