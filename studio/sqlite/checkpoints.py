"""SQLite's WAL checkpoints, taken by a thread of the server's own instead of by a request.

In WAL mode a commit appends its pages to the ``-wal`` file. Once that holds
1,000 pages, SQLite copies them back into the database file (a checkpoint,
with an fsync before and after) in the connection that committed last: a
decision's, or a woken run's. Measured with ``bench/spans.py``, those
checkpoints made the round trip's tail: a stall of 4 to 6 ms in the
decision's commit or the run's, in 1.7 % of approvals. The slowest 3 % took
5.3 to 11.7 ms, and 5.2 to 7.6 ms with no checkpoint at all.

Here one daemon thread per server process asks for a PASSIVE checkpoint
every ``CHECKPOINT_SECONDS``. A PASSIVE checkpoint copies what is committed,
waits for no reader or writer, and runs in SQLite's C code with the GIL
released. Every connection's own threshold is raised to 10,000 pages
(``init_command`` in the settings): with this thread beside a threshold of
1,000, the commits still took most of the checkpoints, since under steady
writes the thread seldom finds the WAL whole and the WAL seldom starts over.
A commit now takes one only if this thread falls that far behind, and then
finds most pages copied already.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import quote

from django.db import DEFAULT_DB_ALIAS, connections

logger = logging.getLogger(__name__)

CHECKPOINT_SECONDS = 0.2

_started: set[str] = set()
_started_lock = threading.Lock()


def start(alias: str = DEFAULT_DB_ALIAS) -> bool:
    """Start this process's checkpoints of ``alias`` if it is a SQLite file; once."""
    if connections[alias].vendor != "sqlite":
        return False
    with _started_lock:
        if alias in _started:
            return True
        _started.add(alias)
    threading.Thread(
        target=Checkpointer(alias).run, name="studio-sqlite-checkpoints", daemon=True
    ).start()
    return True


class Checkpointer:
    """Checkpoints one database's WAL through a connection of its own."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.path = ""
        self.db: sqlite3.Connection | None = None
        self.failing = False  # said once, until a checkpoint works again

    def run(self) -> None:
        while True:
            time.sleep(CHECKPOINT_SECONDS)
            try:
                self.checkpoint()
            except Exception:
                if not self.failing:
                    logger.warning("SQLite checkpoint failed; retrying quietly", exc_info=True)
                self.failing = True
                self.close()
            else:
                self.failing = False

    def checkpoint(self) -> tuple[int, int, int] | None:
        """One PASSIVE checkpoint: (busy, frames in the WAL, frames copied), or None
        when there is no database file (yet, or any more) to checkpoint."""
        db = self._connect()
        if db is None:
            return None
        return db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()

    def _connect(self) -> sqlite3.Connection | None:
        # By the file's name each time: the test runner renames the database
        # after the connection settings exist.
        path = str(connections[self.alias].settings_dict["NAME"] or "")
        if path != self.path:
            self.close()
            self.path = path
        if self.db is not None:
            return self.db
        if not path or path == ":memory:" or path.startswith("file:"):
            return None
        if not Path(f"{path}-wal").exists():
            return None  # not in WAL mode, or nothing written yet
        # mode=rw: never create a database that is not there.
        db = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, isolation_level=None)
        # As the server's connections: a checkpoint syncs the WAL, then the file.
        db.execute("PRAGMA synchronous=NORMAL")
        self.db = db
        return db

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
