"""What this process is stepping now, and what is queued to be claimed here.

One owner: only this module changes the table, under its lock. A run that
waits for a decision is not here (it is only rows, in no process).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from studio.cancel import CancelToken
from studio.runtime import Runtime, runtime


@dataclass(eq=False)
class LocalRun:
    """A run this process is stepping now: its cancel token (Stop reaches it here)."""

    run_id: str
    conversation_id: int
    # The claim number this step holds the run with (``chat.models.Run.claim``).
    claim: int = 0
    cancel: CancelToken = field(default_factory=CancelToken)


class LocalRuns:
    """The table of this process's working runs and of the runs queued for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, LocalRun] = {}
        self._queued: set[str] = set()
        # Some run was stepped here: its row may name this process as the one
        # that stepped it last (cleared as the process exits).
        self.stepped_any = False

    def queue(self, run_id: str) -> bool:
        """Queue ``run_id`` to be claimed here; False if it is queued already (its
        step has not started yet, and will read the rows as they are then)."""
        with self._lock:
            if run_id in self._queued:
                return False
            self._queued.add(run_id)
            return True

    def unqueue(self, run_id: str) -> None:
        with self._lock:
            self._queued.discard(run_id)

    def begin(self, local: LocalRun) -> None:
        """A step of ``local`` runs here now."""
        with self._lock:
            self._runs[local.run_id] = local
            self.stepped_any = True

    def end(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def get(self, run_id: str) -> LocalRun | None:
        with self._lock:
            return self._runs.get(run_id)

    def all(self) -> dict[str, LocalRun]:
        with self._lock:
            return dict(self._runs)


def local_runs(rt: Runtime | None = None) -> LocalRuns:
    """The table of ``rt``'s process (this one's by default)."""
    return (rt or runtime()).part("chat.runs", LocalRuns)
