"""SQLite whose writers in one process queue on a lock instead of SQLite's busy sleeps.

SQLite has one writer at a time. A writer that finds the file locked sleeps
in SQLite's busy handler, in growing pauses of up to 100 ms, and tries again.
Under a burst of decisions (1,000 POSTs, 16 in flight) the decision POSTs and
the runs they woke spent most of their time in those pauses while the CPU
idled: half the process's samples were threads asleep in a write.

Here the threads of one process take a lock for exactly as long as SQLite's
write lock is theirs: from ``BEGIN IMMEDIATE`` to ``COMMIT`` or ``ROLLBACK``
(an atomic block), or for one write statement in autocommit mode. The next
writer starts the moment the last one is done. Reads take no lock (WAL lets
them run beside the writer). Another process on the same file still meets
SQLite's own busy timeout, as before.

Each statement's placeholders are also converted to sqlite3's once per
distinct statement rather than by a regular expression on every execute:
15 us for the decision's read of its row (1.8 KB of SQL), several times per
decision and per woken run.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db.backends.sqlite3 import base
from django.db.utils import OperationalError

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()

# Statements that take SQLite's write lock when run in autocommit mode.
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


def write_lock(name: str) -> threading.Lock:
    """The one writers' lock of this process for the database file ``name``."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(name, threading.Lock())


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writing: threading.Lock | None = None  # the lock this connection holds

    def create_cursor(self, name=None):
        cursor = self.connection.cursor(factory=SQLiteCursorWrapper)
        cursor.wrapper = self
        return cursor

    def write_begin(self) -> bool:
        """Take the writers' lock unless this connection holds it; True if taken here."""
        if self.writing is not None:
            return False
        # By the file's name now: the test runner renames the database after
        # the connection object exists.
        lock = write_lock(str(self.settings_dict["NAME"]))
        # As long as SQLite itself would wait before "database is locked".
        timeout = float(self.settings_dict["OPTIONS"].get("timeout", 5))
        if not lock.acquire(timeout=timeout):
            raise OperationalError("database is locked (another writer in this process)")
        self.writing = lock
        return True

    def write_end(self) -> None:
        lock, self.writing = self.writing, None
        if lock is not None:
            lock.release()

    def _start_transaction_under_autocommit(self) -> None:
        taken = self.write_begin()
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            if taken:
                self.write_end()
            raise

    def _commit(self):
        # A failed COMMIT leaves the transaction open: the rollback that
        # follows it lets go.
        result = super()._commit()
        self.write_end()
        return result

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self.write_end()

    def _close(self):
        try:
            return super()._close()
        finally:
            self.write_end()


@functools.lru_cache(maxsize=1024)
def _qmark(query: str) -> str:
    """Django's "format" style (``%s``, ``%%``) as sqlite3's "qmark" style, as Django does."""
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class SQLiteCursorWrapper(base.SQLiteCursorWrapper):
    wrapper: DatabaseWrapper

    def convert_query(self, query, *, param_names=None):
        if param_names is None:
            return _qmark(query)
        return super().convert_query(query, param_names=param_names)

    def execute(self, query, params=None):
        with self._writing(query):
            return super().execute(query, params)

    def executemany(self, query, param_list):
        with self._writing(query):
            return super().executemany(query, param_list)

    @contextmanager
    def _writing(self, query: str) -> Iterator[None]:
        """A write in autocommit mode holds the lock for its one statement."""
        wrapper = self.wrapper
        taken = (
            wrapper.writing is None
            and wrapper.get_autocommit()
            and query.lstrip()[:7].upper().startswith(WRITES)
            and wrapper.write_begin()
        )
        try:
            yield
        finally:
            if taken:
                wrapper.write_end()
