"""The in-process waiter gate.

A run that needs a decision *registers* a slot for its approval id, then
announces the call (``tool_start``), then *waits* on the slot. The decision
service wakes the slot after its transaction commits. A slot stays woken, so
a decision that lands between registration and the wait is not lost: the
wait returns at once.

Waiting costs no thread. A parked run subscribes a callback (``on_wake``)
that schedules its next step on the event loop; a blocking ``wait`` exists
for callers that do own a thread (tests, helper processes).

The gate holds no decisions itself; the ``ToolApproval`` row is the truth. A
wake from this process's own decision carries the committed row so the run
need not read it again; a wake from elsewhere (another process, the poller)
carries nothing and the run re-reads the row.

A decision made here for a run parked here may also hand the slot its card's
broadcast, already on a short timer (``card``): the run's next fragments
carry it to the tabs, one message instead of two, unless the timer sends it
first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from studio.cancel import Latch


class Slot(Latch):
    """One waiting tool call: woken once its row may have changed."""

    def __init__(self, approval_id: str, run_id: str) -> None:
        super().__init__()
        self.approval_id = approval_id
        self.run_id = run_id
        # The decided row, when the wake came from this process's decision.
        self.outcome: Any = None
        # The decided card's delayed broadcast (a ``studio.runtime.Later``),
        # for the run's next fragments to take along.
        self.card: Any = None
        # True while a run is parked on it (the poller re-reads only these).
        self.waiting = False
        # Nobody has looked at the row since its run wrote it (see ``fresh_look``).
        self._fresh = True

    def wake(self, outcome: Any = None, card: Any = None) -> None:
        def keep() -> None:
            if outcome is not None:
                self.outcome = outcome
            if card is not None:
                self.card = card

        self._set(keep)

    def take_card(self) -> Any:
        """The card handed over by the wake, once (None if there is none)."""
        with self._lock:
            card, self.card = self.card, None
        return card

    def is_woken(self) -> bool:
        return self.is_set()

    def untouched(self) -> bool:
        """True until the first look at the row, unless a wake came first.

        The row is then as its run wrote it a moment ago, pending: whatever
        changes a row wakes its slot (a decision here, the message of one made
        elsewhere, Stop), and a lost message is the poller's, as for any wait.
        """
        return self._fresh and not self._event.is_set()

    def fresh_look(self) -> bool:
        """The first look: True if the slot is still ``untouched``, and never again.

        The slot is left as it is, so a wake from now on is kept.
        """
        with self._lock:
            fresh = self.untouched()
            self._fresh = False
            return fresh

    def clear(self) -> None:
        """Forget past wakes; the caller re-reads the row right after."""
        with self._lock:
            self._event.clear()
            self.outcome = None

    def on_wake(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` at the next wake (now, if already woken); returns an unsubscribe."""
        return self.subscribe(callback)


class Gate:
    """Slots of the runs waiting in this process, by approval id.

    There is one per process (``runtime().gate``); tests empty it
    with ``clear()`` between cases.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, Slot] = {}
        self._by_run: dict[str, set[str]] = {}
        # When the process's poller last looked (monotonic), the wall-clock
        # mark its next quick look starts from, and its last full re-read.
        self.polled_at = float("-inf")
        self.poll_mark: datetime | None = None
        self.full_poll_at = float("-inf")

    def poller_alive(self, interval: float) -> bool:
        """True while a process-wide poller re-reads rows for the waiters."""
        return time.monotonic() - self.polled_at < 3 * interval + 1

    def waiting_ids(self) -> list[str]:
        with self._lock:
            return [a for a, slot in self._slots.items() if slot.waiting]

    def register(self, approval_id: str, *, run_id: str) -> Slot:
        if not approval_id:
            raise ValueError("approval_id must not be empty")
        if not run_id:
            # close_run(run_id) drops a run's slots: an empty id would pool
            # every run-less slot together and one close would drop them all.
            raise ValueError("run_id must not be empty")
        slot = Slot(approval_id, run_id)
        with self._lock:
            if approval_id in self._slots:
                raise ValueError(f"a waiter is already registered for {approval_id!r}")
            self._slots[approval_id] = slot
            self._by_run.setdefault(run_id, set()).add(approval_id)
        return slot

    def wake(self, approval_id: str, outcome: Any = None, card: Any = None) -> bool:
        """Wake the waiter of ``approval_id`` if it lives here; False otherwise."""
        if not approval_id:
            return False
        with self._lock:
            slot = self._slots.get(approval_id)
        if slot is None:
            return False
        slot.wake(outcome, card)
        return True

    def is_parked(self, approval_id: str) -> bool:
        """True while a run of this process is parked on ``approval_id``."""
        with self._lock:
            slot = self._slots.get(approval_id)
        return slot is not None and slot.waiting

    def discard(self, slot: Slot) -> None:
        """Remove ``slot``; the waiter calls this on every way out of its wait."""
        with self._lock:
            if self._slots.get(slot.approval_id) is slot:
                del self._slots[slot.approval_id]
            ids = self._by_run.get(slot.run_id)
            if ids is not None:
                ids.discard(slot.approval_id)
                if not ids:
                    del self._by_run[slot.run_id]

    def close_run(self, run_id: str) -> list[str]:
        """Remove every slot ``run_id`` still holds (announced but never waited on).

        Returns their approval ids so the caller can record them as cancelled.
        """
        with self._lock:
            ids = self._by_run.pop(run_id, set())
            slots = [
                self._slots.pop(approval_id) for approval_id in ids if approval_id in self._slots
            ]
        for slot in slots:
            slot.wake()
        return [slot.approval_id for slot in slots]

    def clear(self) -> None:
        """Drop every slot (tests, and a process shutting down), waking each."""
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
            self._by_run.clear()
            self.polled_at = float("-inf")
            self.poll_mark = None
            self.full_poll_at = float("-inf")
        for slot in slots:
            slot.wake()

    def has(self, approval_id: str) -> bool:
        with self._lock:
            return approval_id in self._slots

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)
