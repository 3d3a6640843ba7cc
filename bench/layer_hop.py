"""Benchmark: one channels-redis hop on this machine, for reading the two-process figures.

A message sent with ``send`` (a process's inbox) and with ``group_send`` (a
conversation's group, one member) until ``receive`` returns it, N times in
one process against the local Redis; no Studio code involved.

    .venv/bin/python bench/layer_hop.py --messages 500
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from channels_redis.core import RedisChannelLayer

REDIS_URL = "redis://127.0.0.1:6379/7"


def percentile(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * p))]


async def hops(messages: int) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=500)
    asyncio.run(hops(parser.parse_args().messages))


if __name__ == "__main__":
    main()
