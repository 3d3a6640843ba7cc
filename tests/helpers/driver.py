"""Drive an Agent on a thread of its own and watch its events.

The engine parks a run on the event loop; here a ``Park`` simply blocks this
test thread on the slot (or Stop, or the deadline), which is the same
contract as far as the agent is concerned.
"""

from __future__ import annotations

import queue
import threading
import time

from django.db import connections

from chat import events
from chat.agent import Agent, AgentSettings
from studio.cancel import CancelToken

BOUND = 20.0
_END = object()


class AgentDriver:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.events: queue.Queue = queue.Queue()
        self.seen: list = []
        self.parks = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    @classmethod
    def scripted(cls, conversation, user, turns: list, *, run=None, **knobs) -> AgentDriver:
        """An agent whose model answers ``turns`` (see ScriptedModel), decisions polled
        every 30 s unless ``knobs`` say otherwise (so a test sees the wake, not the poll)."""
        from tests.factories import make_run
        from tests.helpers.scripted import ScriptedModel

        return cls.start(
            conversation=conversation,
            model=ScriptedModel(turns),
            user=user,
            run=run or make_run(conversation, status="done"),
            knobs={"poll": 30, **knobs},
        )

    @classmethod
    def start(cls, *, knobs: dict | None = None, **agent_kwargs) -> AgentDriver:
        agent_kwargs.setdefault("cancel", CancelToken())
        agent_kwargs["knobs"] = AgentSettings.from_django(**(knobs or {}))
        driver = cls(Agent(**agent_kwargs))
        driver.thread.start()
        return driver

    def _run(self) -> None:
        try:
            for event in self.agent.events():
                if isinstance(event, events.Park):
                    self.parks += 1
                    unsubscribe = self.agent.cancel.subscribe(event.slot.wake)
                    try:
                        event.slot.wait(max(0.0, min(event.deadline - time.monotonic(), 30)))
                    finally:
                        unsubscribe()
                    continue
                self.events.put(event)
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()
            self.events.put(_END)

    def wait_for(self, kind: type, timeout: float = BOUND):
        """The next event of ``kind`` (earlier events are kept in ``seen``)."""
        while True:
            event = self.events.get(timeout=timeout)
            if event is _END:
                raise AssertionError(f"run ended before a {kind.__name__}; saw {self.kinds()}")
            self.seen.append(event)
            if isinstance(event, kind):
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
        return [type(e).__name__ for e in self.seen]

    def of(self, kind: type) -> list:
        return [e for e in self.seen if isinstance(e, kind)]
