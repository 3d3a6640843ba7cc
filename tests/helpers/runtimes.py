"""Ending a test's runtime: what it still steps is cancelled and given time to end."""

from __future__ import annotations

import asyncio

from chat.runs.local import local_runs


async def cancel_local_runs(rt) -> None:
    """Cancel every run ``rt`` steps and wait (10 s at most) until none is left."""
    for local in local_runs(rt).all().values():
        local.cancel.cancel()
    for _ in range(200):
        if not local_runs(rt).all():
            return
        await asyncio.sleep(0.05)
