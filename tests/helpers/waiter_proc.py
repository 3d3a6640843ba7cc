"""Child process: park a run's waiter, the way a daphne process does.

Usage: waiter_proc.py CONVERSATION_ID POLL_SECONDS TIMEOUT_SECONDS
Creates this process's inbox on its event loop, requests an approval from a
worker thread, prints {"approval_id", "inbox"}, waits, prints the outcome.
"""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import django

django.setup()

from asgiref.sync import sync_to_async  # noqa: E402
from django.db import connections  # noqa: E402

from approvals.inbox import ensure_inbox, stop_inbox  # noqa: E402
from approvals.services import approval_request, approval_wait  # noqa: E402
from chat.models import Conversation  # noqa: E402


def run(conversation_id: int, poll: float, timeout: float) -> dict:
    try:
        conversation = Conversation.objects.get(pk=conversation_id)
        approval, slot = approval_request(
            conversation=conversation,
            tool_name="python",
            arguments={"code": "print('hi')"},
            requested_by=conversation.owner,
            run_id="child-run",
        )
        print(
            json.dumps({"approval_id": approval.approval_id, "inbox": approval.waiter_inbox}),
            flush=True,
        )
        outcome = approval_wait(slot=slot, poll=poll, timeout=timeout)
        return {"status": outcome.status, "reason": outcome.reason}
    finally:
        connections.close_all()


async def main() -> None:
    conversation_id, poll, timeout = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    await ensure_inbox()
    pool = ThreadPoolExecutor(max_workers=1)
    result = await sync_to_async(run, thread_sensitive=False, executor=pool)(
        conversation_id, poll, timeout
    )
    print(json.dumps(result), flush=True)
    await stop_inbox()


if __name__ == "__main__":
    asyncio.run(main())
