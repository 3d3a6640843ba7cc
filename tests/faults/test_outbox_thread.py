"""A WSGI worker's outbox: one loop of its own in each forked worker, flushed at exit."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest
from channels_redis.pubsub import RedisPubSubChannelLayer
from redis import Redis

from tests.helpers.procs import ROOT, child_env

pytestmark = pytest.mark.services

BOUND = 20

# As gunicorn runs Studio: the master loads the application (threaded()) and
# forks its workers before any send. Each worker sends 10 and exits at once;
# then the master sends 10 and exits. Sends come from threads with no loop.
SENDER = """
import os, sys
import django
django.setup()
from studio.runtime import runtime

outbox = runtime().outbox
outbox.threaded()
channel = sys.argv[1]

def send(who):
    for n in range(10):
        outbox.channel(channel, {"type": "probe", "who": who, "n": n})

workers = []
for who in ("worker-1", "worker-2"):
    pid = os.fork()
    if pid == 0:
        send(who)
        sys.exit(0)
    workers.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in workers]
send("master")
sys.exit(max(codes))
"""


def test_a_threaded_outbox_sends_from_one_loop_per_worker_and_flushes_at_exit(redis_server):
    layer = RedisPubSubChannelLayer(hosts=[redis_server.url])
    redis = Redis.from_url(redis_server.url)

    async def scenario() -> tuple[list[tuple[str, int]], int, int]:
        channel = await layer.new_channel()
        before = redis.info("stats")["total_connections_received"]
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SENDER, channel,
            cwd=ROOT, env=child_env(REDIS_URL=redis_server.url),
        )  # fmt: skip
        received = []
        with contextlib.suppress(TimeoutError):  # what never came shows below
            for _ in range(30):
                message = await asyncio.wait_for(layer.receive(channel), BOUND)
                received.append((message["who"], message["n"]))
        code = await asyncio.wait_for(sender.wait(), BOUND)
        after = redis.info("stats")["total_connections_received"]
        await layer.flush()
        return received, code, after - before

    received, code, connections = asyncio.run(scenario())

    assert code == 0
    # Each process's sends arrive once each, in the order they were made, though
    # each process exited as soon as it had queued them.
    for who in ("worker-1", "worker-2", "master"):
        assert [n for w, n in received if w == who] == list(range(10)), who
    # A loop per send would have connected 30 times; each process's one loop
    # connects once or twice.
    assert connections <= 6
