"""The cancel token runs, tools and model clients share, and the latch under it.

It lives here, outside both apps, because ``chat.llm`` and ``chat.tools`` are
pure clients and executors that must not import ``approvals``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Latch:
    """A flag that stays set once set, and calls back whoever subscribed to it.

    ``subscribe`` instead of ``wait`` lets a caller blocked on something else
    (a model's stream, a sandboxed tool) hear of it; a callback given after
    the flag is set runs at once, so nothing set in between is missed.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def _set(self, under_lock: Callable[[], None] | None = None) -> None:
        """Set the flag (running ``under_lock`` first, atomically with it), then call back."""
        with self._lock:
            if under_lock is not None:
                under_lock()
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when set (now, if already set); returns an unsubscribe."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._unsubscribe(callback)
        callback()
        return lambda: None

    def _unsubscribe(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


class CancelToken(Latch):
    """A cancel flag that can also wake whoever is blocked on its behalf.

    Stop calls ``cancel()``; a model stream or a tool that is blocked
    subscribes, so it ends at once instead of at its next look.
    """

    # The process gave the run up as it exited (see ``abandon``).
    abandoned = False

    def cancel(self) -> None:
        self._set()

    def abandon(self) -> None:
        """Stop the work at hand for a process that is exiting: unlike Stop, the
        run records nothing of it, and another process takes the run on."""
        self.abandoned = True
        self._set()
