"""The in-process waiter gate.

A run that needs a decision *registers* a slot for its approval id, then
announces the call (``tool_start``), then *waits* on the slot. The decision
service wakes the slot after its transaction commits. Because the slot is an
``Event`` that stays set, a decision that lands between registration and the
blocking wait is not lost: the wait returns at once.

The gate holds no decisions itself; the ``ToolApproval`` row is the truth and
the waiter re-reads it after every wake-up (and on a poll interval, in case a
cross-process wake message was lost).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class Slot:
    approval_id: str
    run_id: str
    event: threading.Event = field(default_factory=threading.Event)
    waiting: bool = False

    def wake(self) -> None:
        self.event.set()


class Gate:
    """Slots of the runs waiting in this process, by approval id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, Slot] = {}
        self._by_run: dict[str, set[str]] = {}
        # When the process's poller last re-read the waiting rows (monotonic).
        self.polled_at = float("-inf")

    def poller_alive(self, interval: float) -> bool:
        """True while a process-wide poller re-reads rows for the waiters."""
        return time.monotonic() - self.polled_at < 3 * interval + 1

    def waiting_ids(self) -> list[str]:
        with self._lock:
            return [a for a, slot in self._slots.items() if slot.waiting]

    def register(self, approval_id: str, *, run_id: str = "") -> Slot:
        if not approval_id:
            raise ValueError("approval_id must not be empty")
        slot = Slot(approval_id=approval_id, run_id=run_id)
        with self._lock:
            if approval_id in self._slots:
                raise ValueError(f"a waiter is already registered for {approval_id!r}")
            self._slots[approval_id] = slot
            self._by_run.setdefault(run_id, set()).add(approval_id)
        return slot

    def wake(self, approval_id: str) -> bool:
        """Wake the waiter of ``approval_id`` if it lives here; False otherwise."""
        if not approval_id:
            return False
        with self._lock:
            slot = self._slots.get(approval_id)
        if slot is None:
            return False
        slot.wake()
        return True

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
        for slot in slots:
            slot.wake()

    def has(self, approval_id: str) -> bool:
        with self._lock:
            return approval_id in self._slots

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)


# The process's gate. Tests may build their own Gate for isolation.
GATE = Gate()
