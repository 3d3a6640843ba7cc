"""Child process: park a run's waiter, the way a daphne process does.

Usage: waiter_proc.py CONVERSATION_ID POLL_SECONDS TIMEOUT_SECONDS
Starts this process's runtime (its inbox and poller) on an event loop,
requests an approval, prints {"approval_id", "inbox"}, parks without a
thread until the row is decided, then prints the outcome.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import django

django.setup()

from approvals.services.waiting import approval_check, approval_request  # noqa: E402
from chat.models import Conversation  # noqa: E402
from studio.cancel import CancelToken  # noqa: E402
from studio.runtime import runtime  # noqa: E402


def request(conversation_id: int):
    conversation = Conversation.objects.get(pk=conversation_id)
    return approval_request(
        conversation=conversation,
        tool_name="python",
        arguments={"code": "print('hi')"},
        requested_by=conversation.owner,
        run_id="child-run",
    )


def resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def main() -> None:
    # (The poll interval reaches this process as STUDIO_APPROVAL_POLL_SECONDS.)
    conversation_id, timeout = int(sys.argv[1]), float(sys.argv[3])
    rt = runtime()
    await rt.start()
    approval, slot = await rt.off_loop(request, conversation_id)
    print(json.dumps({"approval_id": approval.approval_id, "inbox": approval.waiter_inbox}))
    sys.stdout.flush()
    deadline = time.monotonic() + timeout
    loop = asyncio.get_running_loop()
    slot.waiting = True
    while True:
        outcome = await rt.off_loop(
            approval_check, slot=slot, cancel=CancelToken(), deadline=deadline
        )
        if outcome is not None:
            break
        woken = loop.create_future()
        slot.on_wake(lambda woken=woken: loop.call_soon_threadsafe(resolve, woken))
        try:
            await asyncio.wait_for(woken, max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            pass
    print(json.dumps({"status": outcome.status, "reason": outcome.reason}), flush=True)
    await rt.stop()


if __name__ == "__main__":
    asyncio.run(main())
