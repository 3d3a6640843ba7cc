"""Keep the SQLite database private to the server's user.

Tools run as unprivileged uids; a world-readable database file would hand
them every session and approval. The file is created by whoever migrates
first, with the umask of the day, so we tighten it on every connection.
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
    with contextlib.suppress(OSError):
        if os.stat(name).st_mode & 0o077:
            os.chmod(name, 0o600)
