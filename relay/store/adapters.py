"""Which store adapter a database URL takes: PostgreSQL (``postgresql://``, or a libpq
keyword string) or MySQL 8 / MariaDB (``mysql://``, ``mariadb://``).

Each adapter is imported only when its URL is used: the MySQL drivers are an
extra (``pip install 'outbox-relay[mysql]'``).
"""

from __future__ import annotations

from types import ModuleType

from relay.config import NATIVE, TableLayout, TableName, is_mysql_url
from relay.errors import ConfigError
from relay.store.base import Admin, Store


def _mysql() -> ModuleType:
    try:
        import relay.store.mysql as mysql
    except ImportError as exc:
        raise ConfigError(
            f"mysql:// needs the MySQL drivers ({exc.name} is missing): pip install 'outbox-relay[mysql]'"
        ) from None
    return mysql


def _native_only(layout: TableLayout) -> None:
    if layout.debezium:
        raise ConfigError("--table-layout debezium is for PostgreSQL: a MySQL outbox has the native columns")


def build_store(
    url: str,
    table: TableName,
    *,
    owner: str,
    lease_seconds: float,
    keep_sent: bool,
    listen: bool,
    layout: TableLayout = NATIVE,
) -> Store:
    """The relay's store for ``url``; ``listen`` applies to PostgreSQL only (MySQL always polls)."""
    if is_mysql_url(url):
        _native_only(layout)
        store: Store = _mysql().MySQLStore(url, table, owner=owner, lease_seconds=lease_seconds, keep_sent=keep_sent)
        return store
    from relay.store.postgres import PostgresStore

    return PostgresStore(
        url, table, owner=owner, lease_seconds=lease_seconds, keep_sent=keep_sent, listen=listen, layout=layout
    )


def build_admin(url: str, table: TableName, layout: TableLayout = NATIVE) -> Admin:
    """The operator's port for ``url``."""
    if is_mysql_url(url):
        _native_only(layout)
        admin: Admin = _mysql().MySQLAdmin(url, table)
        return admin
    from relay.store.postgres import PostgresAdmin

    return PostgresAdmin(url, table, layout=layout)


def migrate(url: str, table: TableName, *, notify: bool | None = None, layout: TableLayout = NATIVE) -> list[int]:
    """Apply the migrations ``table`` lacks (``notify`` is PostgreSQL's NOTIFY trigger switch)."""
    if is_mysql_url(url):
        _native_only(layout)
        if notify:  # off is what MySQL has: an environment shared with PostgreSQL may well say so
            raise ConfigError("--notify is for PostgreSQL: MySQL has no NOTIFY, relays poll")
        _mysql()
        from relay.store.mysql.migrate import migrate as migrate_mysql

        return migrate_mysql(url, table)
    from relay.store.migrate import migrate as migrate_postgres

    return migrate_postgres(url, table, notify=notify, layout=layout)


def create_roles(url: str, table: TableName, *, relay_role: str, writer_role: str, log_source: bool = False) -> None:
    """Create the relay and writer roles with the least they need (see ``migrate --create-roles``);
    ``log_source``: a relay of ``--source log`` (PostgreSQL only), which also inserts rows."""
    if is_mysql_url(url):
        _mysql()
        from relay.store.mysql.migrate import create_roles as roles_mysql

        roles_mysql(url, table, relay_role=relay_role, writer_role=writer_role)
        return
    from relay.store.migrate import create_roles as roles_postgres

    roles_postgres(url, table, relay_role=relay_role, writer_role=writer_role, log_source=log_source)
