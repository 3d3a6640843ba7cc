"""Studio for ``bench/spans.py``: ``bench.asgi`` with a clock stamp at each step of a decision.

Each stamp is ``time.perf_counter()`` (``CLOCK_MONOTONIC`` on Linux: one
clock for the client and the server) at one point of the round trip:

* H0, H9: the HTTP handler's entry and exit on the loop (POSTs only);
* H1, H4: the start and end of a POST's Django side on its pool thread,
  whose thread CPU is kept too;
* H2, H3: the decision view's call of ``approval_decide`` and its return;
* H5: the answer handed to daphne;
* W: the wake of the waiting call;
* S0, S9: a run's step starts and parks or ends on the agent pool;
* S1, S2: the run's urgent flush (a tool's result) sent and delivered;
  the step's thread CPU from S0 to S1 is kept too;
* C0, C1: the consumer's send of a fragment holding a tool's result.

The stamps are written to ``$STAMP_OUT`` on SIGUSR1 (the Django side's
thread CPU to ``$STAMP_OUT.cpu``, the step's to ``$STAMP_OUT.step``).
Measurement only: the wrappers add a microsecond or two to each span.

    daphne bench.stamped_asgi:application
"""

from __future__ import annotations

import os
import signal
import threading
import time

from bench.asgi import application  # noqa: F401 - sets Django up first  # isort: skip
from approvals import gate, services, views
from chat import consumers, engine
from studio import handlers, runtime

# (A list's append is atomic: the threads and the loop stamp without a lock,
# which the signal handler, run on the loop's thread, could not take again.)
STAMPS: list[tuple[str, float]] = []
DJANGO_CPU: list[float] = []
STEP_CPU: list[float] = []
# The thread CPU at the start (S0) of the step this thread runs, until its S1.
_in_step = threading.local()


def stamp(name: str) -> None:
    STAMPS.append((name, time.perf_counter()))


def dump(*_) -> None:
    """Write the three files; the ``.cpu`` one, renamed into place last, says all are whole."""
    out = os.environ["STAMP_OUT"]
    stamps, cpu, step = list(STAMPS), list(DJANGO_CPU), list(STEP_CPU)
    with open(out, "w") as f:
        f.writelines(f"{name} {t:.9f}\n" for name, t in stamps)
    with open(out + ".step", "w") as f:
        f.writelines(f"{seconds:.9f}\n" for seconds in step)
    with open(out + ".cpu.tmp", "w") as f:
        f.writelines(f"{seconds:.9f}\n" for seconds in cpu)
    os.replace(out + ".cpu.tmp", out + ".cpu")


signal.signal(signal.SIGUSR1, dump)

_call = handlers.OneHopASGIHandler.__call__
_respond = handlers.OneHopASGIHandler._respond
_send_response = handlers.OneHopASGIHandler.send_response


async def _stamped_call(self, scope, receive, send) -> None:
    post = scope.get("method") == "POST"
    if post:
        stamp("H0")
    await _call(self, scope, receive, send)
    if post:
        stamp("H9")


def _stamped_respond(self, scope, *args):
    if scope.get("method") != "POST":
        return _respond(self, scope, *args)
    cpu = time.thread_time()
    stamp("H1")
    response = _respond(self, scope, *args)
    stamp("H4")
    DJANGO_CPU.append(time.thread_time() - cpu)
    return response


async def _stamped_send_response(self, *args) -> None:
    await _send_response(self, *args)
    stamp("H5")


handlers.OneHopASGIHandler.__call__ = _stamped_call
handlers.OneHopASGIHandler._respond = _stamped_respond
handlers.OneHopASGIHandler.send_response = _stamped_send_response

_decide = services.approval_decide


def _stamped_decide(**kwargs):
    stamp("H2")
    result = _decide(**kwargs)
    stamp("H3")
    return result


views.approval_decide = _stamped_decide

_wake = gate.Gate.wake


def _stamped_wake(self, *args, **kwargs):
    stamp("W")
    return _wake(self, *args, **kwargs)


gate.Gate.wake = _stamped_wake

_step = engine.Stepper.step


def _stamped_step(self):
    _in_step.cpu = time.thread_time()
    stamp("S0")
    park = _step(self)
    stamp("S9")
    return park


engine.Stepper.step = _stamped_step

_group = runtime.Outbox.group


def _stamped_group(self, group: str, message: dict, *, wait: bool = False) -> None:
    if wait:
        stamp("S1")
        started = getattr(_in_step, "cpu", None)
        if started is not None:
            STEP_CPU.append(time.thread_time() - started)
            _in_step.cpu = None
    _group(self, group, message, wait=wait)
    if wait:
        stamp("S2")


runtime.Outbox.group = _stamped_group

_fragment = consumers.ChatConsumer.chat_fragment


async def _stamped_fragment(self, event: dict) -> None:
    result = "data-tool-result=" in event["html"]
    if result:
        stamp("C0")
    await _fragment(self, event)
    if result:
        stamp("C1")


consumers.ChatConsumer.chat_fragment = _stamped_fragment
