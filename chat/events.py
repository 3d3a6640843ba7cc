"""What a run tells the world, one small type per kind.

The agent yields these; the engine renders them into fragments for every
tab (``chat.publisher.Publisher``); ``Wait`` ends a step. They carry ids and
the plain values a fragment needs, never ORM rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Status:
    """A line under the transcript ("Thinking…", "Running python…")."""

    text: str


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of the model's reply as it streams."""

    text: str


@dataclass(frozen=True, slots=True)
class CallView:
    call_id: str
    name: str
    arguments: dict


@dataclass(frozen=True, slots=True)
class TurnSaved:
    """The model's turn is final and saved, with the calls it asks for."""

    message_id: int
    content: str
    created_at: datetime
    calls: tuple[CallView, ...] = ()
    model_name: str = ""


@dataclass(frozen=True, slots=True)
class ToolStarted:
    """A call is announced: with its approval card (waiting or not), or without a row."""

    message_id: int
    call: CallView
    approval_id: str
    awaiting: bool
    needs_review: bool = False  # it waits on a reviewer, not on the member


@dataclass(frozen=True, slots=True)
class TurnAsked:
    """Several calls of one turn wait for decisions: they can be decided together."""

    message_id: int
    approval_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ToolFinished:
    """A call's result is saved (it ran, or the model is told why not)."""

    message_id: int
    call: CallView
    result_id: int
    result: str
    ok: bool
    approval_id: str
    created_at: datetime
    conversation_id: int = 0
    images: tuple[dict, ...] = ()
    stopped_by: str = ""  # cut short by Stop: who pressed it


@dataclass(frozen=True, slots=True)
class Failed:
    """The run ends with an error the member reads in the chat."""

    message_id: int
    text: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Done:
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """The run waits for a decision on this call: the step ends, the run is only rows."""

    approval_id: str


Event = Status | Delta | TurnSaved | ToolStarted | TurnAsked | ToolFinished | Failed | Done | Wait
