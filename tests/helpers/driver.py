"""Drive an Agent on a thread of its own and watch its events.

The engine ends a step at ``Wait`` and a decision resumes the run; here the
thread watches the row until it is decided (or Stop is pressed), then takes
the next step with a fresh Agent, read from the rows as any process would.
"""

from __future__ import annotations

import queue
import threading
import time

from django.db import connections
from django.utils import timezone

from approvals.models import ToolApproval
from chat import events
from chat.agent import Agent, AgentSettings
from studio.cancel import CancelToken

BOUND = 20.0
_END = object()


class AgentDriver:
    def __init__(self, agent: Agent, agent_kwargs: dict) -> None:
        self.agent = agent
        self.agent_kwargs = agent_kwargs
        self.events: queue.Queue = queue.Queue()
        self.seen: list = []
        self.parks = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    @classmethod
    def scripted(cls, conversation, user, turns: list, *, run=None, **knobs) -> AgentDriver:
        """An agent whose model answers ``turns`` (see ScriptedModel)."""
        from tests.factories import make_run
        from tests.helpers.scripted import ScriptedModel

        return cls.start(
            conversation=conversation,
            model=ScriptedModel(turns),
            user=user,
            run=run or make_run(conversation),
            knobs=knobs,
        )

    @classmethod
    def start(cls, *, knobs: dict | None = None, **agent_kwargs) -> AgentDriver:
        agent_kwargs.setdefault("cancel", CancelToken())
        agent_kwargs["knobs"] = AgentSettings.from_django(**(knobs or {}))
        driver = cls(Agent(**agent_kwargs), agent_kwargs)
        driver.thread.start()
        return driver

    def _run(self) -> None:
        try:
            while True:
                waiting_on = None
                for event in self.agent.events():
                    if isinstance(event, events.Wait):
                        waiting_on = event.approval_id
                        break
                    self.events.put(event)
                if waiting_on is None:
                    return
                self.parks += 1
                self._wait(waiting_on)
                self.agent = Agent(**self.agent_kwargs)  # the next step, from the rows
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()
            self.events.put(_END)

    def _wait(self, approval_id: str) -> None:
        """Until the row is decided or ended, Stop is pressed, or its time is up."""
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline and not self.agent.cancel.is_set():
            row = ToolApproval.objects.filter(approval_id=approval_id).first()
            if row is None or not row.is_pending:
                return
            if row.expires_at is not None and row.expires_at <= timezone.now():
                return
            connections.close_all()
            time.sleep(0.02)

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
