"""``migrate --create-roles`` on real MariaDB: grants that reach the roles from outside the table.

``REVOKE ALL PRIVILEGES ON`` the table takes back only the table's grants: a
role that also held privileges on the whole database, on every database, through a
role granted to it or through PUBLIC kept them, and create_roles said "granted".
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pymysql
import pytest

from relay.config import TableName
from relay.errors import SchemaError
from relay.store.mysql.migrate import create_roles
from tests import mysql_support

TABLE = TableName.parse("outbox")


@pytest.fixture
def roles(mysql_url: str) -> Iterator[dict[str, str]]:
    """A relay, a writer and another role (roles are the server's), dropped after the test; PUBLIC's grants too."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"{kind}_t_{suffix}" for kind in ("relay", "writer", "other")}
    for role in names.values():
        mysql_support.execute(mysql_url, f"CREATE ROLE `{role}`")
    yield names
    for role in names.values():
        mysql_support.execute(mysql_url, f"DROP ROLE IF EXISTS `{role}`")
    database = mysql_url.rsplit("/", 1)[1]
    for on in ("outbox", "outbox_schema_version"):
        with contextlib.suppress(pymysql.MySQLError):  # PUBLIC had none
            mysql_support.execute(mysql_url, f"REVOKE ALL PRIVILEGES ON `{database}`.`{on}` FROM PUBLIC")


#: Grants that reach a role from outside the table's own, and the role create_roles must refuse.
REACHING = {
    "the database to the writer": ("GRANT UPDATE, DELETE ON `{db}`.* TO `{writer}`", "writer"),
    "a database pattern to the relay": ("GRANT ALL PRIVILEGES ON `{pattern}`.* TO `{relay}`", "relay"),
    "every database to the writer": ("GRANT SELECT ON *.* TO `{writer}`", "writer"),
    "a role granted to the writer": ("GRANT UPDATE (payload) ON `{db}`.outbox TO `{other}`", "writer"),
    "a role granted to the relay": ("GRANT INSERT ON `{db}`.outbox TO `{other}`", "relay"),
    "the relay role to the writer": ("GRANT `{relay}` TO `{writer}`", "writer"),
    "the writer role to the relay": ("GRANT `{writer}` TO `{relay}`", "relay"),
    "the version table to a role granted to the relay": (
        "GRANT DELETE ON `{db}`.outbox_schema_version TO `{other}`", "relay",
    ),
    "PUBLIC": ("GRANT SELECT ON `{db}`.outbox TO PUBLIC", "writer"),
}  # fmt: skip


@pytest.mark.parametrize("case", REACHING)
def test_create_roles_refuses_a_role_that_other_grants_give_more(
    mysql_url: str, roles: dict[str, str], case: str
) -> None:
    grant, refused = REACHING[case]
    database = mysql_url.rsplit("/", 1)[1]
    mysql_support.execute(mysql_url, f"GRANT `{roles['other']}` TO `{roles[refused]}`")
    # A pattern that matches the database: its name with its last character as the wildcard.
    fill = {**roles, "db": database, "pattern": database.replace("_", "\\_")[:-1] + "_"}
    mysql_support.execute(mysql_url, grant.format(**fill))
    with pytest.raises(SchemaError, match=f"role '{roles[refused]}' may still do more than it needs"):
        create_roles(mysql_url, TABLE, relay_role=roles["relay"], writer_role=roles["writer"])


@pytest.mark.parametrize(
    "grant",
    [
        "GRANT ALL PRIVILEGES ON `{db}_other`.* TO `{writer}`",
        "GRANT SELECT, UPDATE ON `{db}`.outbox_other TO `{writer}`",
        "GRANT SELECT (idempotency_key) ON `{db}`.outbox TO `{other}`",
        "GRANT SELECT ON `{db}`.outbox TO `{relay}`",
    ],
)
def test_grants_that_do_not_reach_the_table_are_no_reason_to_refuse(
    mysql_url: str, roles: dict[str, str], grant: str
) -> None:
    database = mysql_url.rsplit("/", 1)[1]
    mysql_support.execute(mysql_url, "CREATE TABLE outbox_other (id INT PRIMARY KEY)")
    mysql_support.execute(mysql_url, f"GRANT `{roles['other']}` TO `{roles['relay']}`")
    mysql_support.execute(mysql_url, grant.format(**roles, db=database))
    create_roles(mysql_url, TABLE, relay_role=roles["relay"], writer_role=roles["writer"])


@pytest.mark.parametrize(
    ("grant", "role"),
    [
        ("GRANT INSERT, UPDATE, DELETE ON `{db}`.outbox_schema_version TO `{relay}`", "relay"),
        ("GRANT SELECT, INSERT ON `{db}`.outbox_schema_version TO `{writer}`", "writer"),
        ("GRANT DROP, ALTER ON `{db}`.outbox_schema_version TO `{relay}`", "relay"),
    ],
)
def test_create_roles_again_takes_back_grants_on_the_version_table(
    mysql_url: str, roles: dict[str, str], grant: str, role: str
) -> None:
    database = mysql_url.rsplit("/", 1)[1]
    create_roles(mysql_url, TABLE, relay_role=roles["relay"], writer_role=roles["writer"])
    mysql_support.execute(mysql_url, grant.format(**roles, db=database))
    create_roles(mysql_url, TABLE, relay_role=roles["relay"], writer_role=roles["writer"])
    shown = [line for (line,) in mysql_support.execute(mysql_url, f"SHOW GRANTS FOR `{roles[role]}`")]
    on_version = [line for line in shown if "outbox_schema_version" in line]
    assert on_version == ([f"GRANT SELECT ON `{database}`.`outbox_schema_version` TO `{roles[role]}`"]
                          if role == "relay" else [])  # fmt: skip


@pytest.mark.parametrize("step", ["migrate", "create_roles"])
def test_a_migration_lock_held_past_the_wait_is_an_error_and_nothing_runs_without_it(
    mysql_url: str, roles: dict[str, str], step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay.errors import StoreUnavailable
    from relay.store.mysql import migrate as mysql_migrate

    monkeypatch.setattr(mysql_migrate, "LOCK_WAIT_SECONDS", 1)
    holder = mysql_support.connect(mysql_url)
    try:
        with holder.cursor() as cur:
            lock = mysql_migrate._lock_name(cur, TABLE)
            cur.execute("SELECT GET_LOCK(%s, 0)", (lock,))
            assert cur.fetchone() == (1,)
        with pytest.raises(StoreUnavailable, match="held its lock for 1s"):
            if step == "migrate":
                mysql_migrate.migrate(mysql_url, TABLE)
            else:
                create_roles(mysql_url, TABLE, relay_role=roles["relay"], writer_role=roles["writer"])
    finally:
        holder.close()
    granted = mysql_support.execute(mysql_url, f"SHOW GRANTS FOR `{roles['writer']}`")
    assert not any("outbox" in row[0] for row in granted), granted
