from __future__ import annotations

import asyncio

import pytest

from studio.runtime import replace_runtime, restore_runtime, runtime


@pytest.fixture
async def rt(settings):
    """A fresh runtime on this test's loop (four agent workers, a quick sweep), put back after."""
    settings.STUDIO_APPROVAL_POLL_SECONDS = 0.1
    old = runtime()
    fresh = replace_runtime(agent_workers=4)
    await fresh.start()
    yield fresh
    for local in fresh.local_runs().values():
        local.cancel.cancel()
    for _ in range(200):
        if not fresh.local_runs():
            break
        await asyncio.sleep(0.05)
    await fresh.stop()
    restore_runtime(old)
    assert not fresh.local_runs(), "a run outlived its test"
