"""Keep the SQLite database private to the server's user.

Tools run as unprivileged uids; a world-readable database file would hand
them every session and approval. The file is created by whoever migrates
first, with the umask of the day, so we tighten it on every connection. In
WAL mode the recent writes live in the ``-wal`` file (and its ``-shm``
index), which SQLite may have created before this runs: they get the same
treatment.
"""

from __future__ import annotations

import contextlib
import os

from django.db.backends.signals import connection_created
from django.dispatch import receiver


@receiver(connection_created)
def _private_sqlite_file(sender, connection, **kwargs) -> None:
    if connection.vendor != "sqlite":
        return
    name = str(connection.settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    for path in (name, f"{name}-wal", f"{name}-shm"):
        with contextlib.suppress(OSError):
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
