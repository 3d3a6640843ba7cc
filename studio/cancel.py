"""The cancel token runs, tools and model clients share.

It lives here, outside both apps, because ``chat.llm`` and ``chat.tools`` are
pure clients and executors that must not import ``approvals``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelToken:
    """A cancel flag that can also wake whoever is blocked on its behalf.

    Stop, a closed run or a shutting-down server call ``cancel()``; a waiting
    slot subscribes so the wait ends at once instead of at the next poll.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on cancel (now, if already cancelled); returns an unsubscribe."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._unsubscribe(callback)
        callback()
        return lambda: None

    def _unsubscribe(self, callback: Callable[[], None]) -> None:
        with self._lock:
            try:
                self._callbacks.remove(callback)
            except ValueError:
                pass
