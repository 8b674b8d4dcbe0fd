"""Writers for the fault scenarios on MySQL: ``publish()`` on PyMySQL and plain SQL, some rolled back."""

from __future__ import annotations

import json
from typing import Any

import producers
from tests import mysql_support
from tests.faults.checker import Writers


class MySQLWriters(Writers):
    """:class:`Writers` on a MySQL outbox: every other event by ``publish()``, the rest by a plain INSERT."""

    def _commit(self, conn: Any, batch: list[tuple[str, str, int]], rollback: bool) -> Any:
        if conn is None:
            conn = mysql_support.connect(self.database_url, autocommit=False)
        self._publish(conn, batch, rollback)
        return conn

    def _publish(self, conn: Any, batch: list[tuple[str, str, int]], rollback: bool) -> None:
        try:
            with conn.cursor() as cur:
                for n, (idem, key, seq) in enumerate(batch):
                    payload = {"key": key, "seq": seq}
                    if n % 2 == 0:
                        producers.publish(conn, self.topic, payload, key=key, idempotency_key=idem, table=self.table)
                    else:
                        cur.execute(
                            f"INSERT INTO `{self.table}` (topic, `key`, payload, idempotency_key)"
                            " VALUES (%s, %s, %s, %s)",
                            [self.topic, key, json.dumps(payload), idem],
                        )
        except BaseException:
            conn.rollback()
            raise
        if rollback:
            conn.rollback()
        else:
            conn.commit()
