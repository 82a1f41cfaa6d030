"""Open the store named by `state.backend.ndb.url`."""

from __future__ import annotations

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import ConfigurationError
from pyflink_ndb.stores.base import StateStore


def create_store(options: NdbStateOptions) -> StateStore:
    """A store for the options' URL, not yet opened.

    :raises ConfigurationError: the URL scheme is neither `mysql://` nor `sqlite:///`.
    """
    url = options.url
    if url.startswith("sqlite:///"):
        from pyflink_ndb.stores.sqlite import SqliteStateStore

        return SqliteStateStore(url[len("sqlite:///"):], options.namespace,
                                options.write_batch_rows)
    if url.startswith("mysql://"):
        from pyflink_ndb.stores.mysql import MysqlStateStore
        from pyflink_ndb.stores.retry import RetryPolicy

        socket_timeout_s = options.db_socket_timeout_ms / 1000.0
        return MysqlStateStore(
            url, options.namespace, options.write_batch_rows, user=options.user,
            password=options.resolve_password(), read_timeout_s=socket_timeout_s,
            write_timeout_s=socket_timeout_s,
            retry=RetryPolicy(max_attempts=options.db_retry_max_attempts,
                              max_backoff_ms=options.db_retry_max_backoff_ms,
                              deadline_ms=options.db_retry_deadline_ms))
    raise ConfigurationError(
        "state.backend.ndb.url must start with mysql:// or sqlite:/// "
        f"(got a URL starting with {url.split(':', 1)[0]!r}).")


def open_store(options: NdbStateOptions, create: bool = True) -> StateStore:
    """Create and open the store (tables are created when missing, if `create`).

    :raises StoreUnavailableError: the database cannot be reached.
    :raises StateCompatibilityError: see :meth:`StateStore.open`.
    """
    store = create_store(options)
    if not create and options.url.startswith("sqlite:///"):
        from pathlib import Path

        path = options.url[len("sqlite:///"):]
        if path != ":memory:" and not Path(path).exists():
            from pyflink_ndb.errors import StoreUnavailableError

            raise StoreUnavailableError(f"No SQLite store at {path!r}: check the URL.")
    store.open(create=create)
    return store
