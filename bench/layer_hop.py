"""Benchmark: one channel-layer hop on this machine, for reading the round-trip figures.

A message sent with ``send`` (a process's inbox) and with ``group_send`` (a
conversation's group, one member) until ``receive`` returns it, N times in
one process. ``--layer core`` and ``pubsub``: channels-redis's two layers
against the local Redis (Studio uses Pub/Sub). ``--layer memory``: Channels'
in-memory layer; ``local``: Studio's (``studio.layers``), the one a process
without Redis uses. ``--sockets N`` first opens N other channels, each in a
group of its own, as a process with N open tabs has them.

    .venv/bin/python bench/layer_hop.py --messages 500
    .venv/bin/python bench/layer_hop.py --messages 500 --layer pubsub
    .venv/bin/python bench/layer_hop.py --messages 2000 --layer memory --sockets 1000
    .venv/bin/python bench/layer_hop.py --messages 2000 --layer local --sockets 1000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import harness  # noqa: F401 - puts the repository on sys.path
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer

from studio.layers import LocalChannelLayer

REDIS_URL = "redis://127.0.0.1:6379/7"


def percentile(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * p))]


async def hops(messages: int, layer: str, sockets: int) -> None:
    if layer in ("memory", "local"):
        receiver = sender = (InMemoryChannelLayer if layer == "memory" else LocalChannelLayer)()
    elif layer == "pubsub":
        config = {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]}
        receiver, sender = RedisPubSubChannelLayer(**config), RedisPubSubChannelLayer(**config)
    else:
        config = {"hosts": [{"address": REDIS_URL, "socket_timeout": None}], "capacity": 10_000}
        receiver, sender = RedisChannelLayer(**config), RedisChannelLayer(**config)
    for i in range(sockets):
        await receiver.group_add(f"bench-tab-{i}", await receiver.new_channel())
    channel = await receiver.new_channel()
    await receiver.group_add("bench-hop", channel)
    fragment = {"type": "chat.fragment", "html": "x" * 2000}
    for label, send in (
        ("send -> receive", lambda: sender.send(channel, {"type": "approval.decided"})),
        ("group_send -> receive", lambda: sender.group_send("bench-hop", fragment)),
    ):
        latencies = []
        for _ in range(messages):
            t0 = time.perf_counter()
            await send()
            await receiver.receive(channel)
            latencies.append((time.perf_counter() - t0) * 1000)
        print(
            f"{label:24} p50 {statistics.median(latencies):5.2f} ms  "
            f"p99 {percentile(latencies, 0.99):5.2f} ms  (n={messages})"
        )
    await receiver.group_discard("bench-hop", channel)
    if layer == "pubsub":
        await receiver.flush()
        await sender.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--layer", choices=("core", "pubsub", "memory", "local"), default="core")
    parser.add_argument("--sockets", type=int, default=0, help="other open channels, in-memory")
    args = parser.parse_args()
    asyncio.run(hops(args.messages, args.layer, args.sockets))


if __name__ == "__main__":
    main()
