"""Benchmark: one channels-redis hop on this machine, for reading the two-process figures.

A message sent with ``send`` (a process's inbox) and with ``group_send`` (a
conversation's group, one member) until ``receive`` returns it, N times in
one process against the local Redis; no Studio code involved. ``--layer
pubsub`` measures channels-redis's Pub/Sub layer instead of the core layer
Studio uses, to size what a switch would save.

    .venv/bin/python bench/layer_hop.py --messages 500
    .venv/bin/python bench/layer_hop.py --messages 500 --layer pubsub
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from channels_redis.core import RedisChannelLayer
from channels_redis.pubsub import RedisPubSubChannelLayer

REDIS_URL = "redis://127.0.0.1:6379/7"


def percentile(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * p))]


async def hops(messages: int, layer: str) -> None:
    if layer == "pubsub":
        config = {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]}
        receiver, sender = RedisPubSubChannelLayer(**config), RedisPubSubChannelLayer(**config)
    else:
        config = {"hosts": [{"address": REDIS_URL, "socket_timeout": None}], "capacity": 10_000}
        receiver, sender = RedisChannelLayer(**config), RedisChannelLayer(**config)
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
    parser.add_argument("--layer", choices=("core", "pubsub"), default="core")
    args = parser.parse_args()
    asyncio.run(hops(args.messages, args.layer))


if __name__ == "__main__":
    main()
