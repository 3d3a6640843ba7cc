"""Drive an Agent in a worker thread, as the consumer does, and watch its events."""

from __future__ import annotations

import queue
import threading

from django.db import connections

from chat.agent import Agent
from studio.cancel import CancelToken

BOUND = 20.0
_END = object()


class AgentDriver:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.events: queue.Queue = queue.Queue()
        self.seen: list = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    @classmethod
    def start(cls, **agent_kwargs) -> AgentDriver:
        agent_kwargs.setdefault("cancel", CancelToken())
        driver = cls(Agent(**agent_kwargs))
        driver.thread.start()
        return driver

    def _run(self) -> None:
        try:
            for event in self.agent.events():
                self.events.put(event)
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()
            self.events.put(_END)

    def wait_for(self, kind: str, timeout: float = BOUND):
        """The next event of ``kind`` (earlier events are kept in ``seen``)."""
        while True:
            event = self.events.get(timeout=timeout)
            if event is _END:
                raise AssertionError(f"run ended before a {kind!r} event; saw {self.kinds()}")
            self.seen.append(event)
            if event.kind == kind:
                return event

    def finish(self, timeout: float = BOUND) -> list:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"run did not end; saw {self.kinds()}"
        while True:
            event = self.events.get_nowait()
            if event is _END:
                break
            self.seen.append(event)
        if self.error:
            raise self.error
        return self.seen

    def kinds(self) -> list[str]:
        return [e.kind for e in self.seen]

    def of(self, kind: str) -> list:
        return [e for e in self.seen if e.kind == kind]
