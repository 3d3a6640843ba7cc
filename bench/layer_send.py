"""Benchmark: Studio's in-memory layer's send and receive against Channels' own.

One process, no server: a 2 KB fragment is sent to a group of one member
and received, many times in a loop, through ``studio.layers.LocalChannelLayer``
as it is and through the same class with Channels' ``send`` and ``receive``
put back (a throwaway ``asyncio.Queue`` on each, a ``deepcopy`` of each
message). Prints the median of seven runs of each, alternating.

    .venv/bin/python bench/layer_send.py --messages 5000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import harness  # noqa: F401 - puts the repository on sys.path
from channels.layers import InMemoryChannelLayer

from studio.layers import LocalChannelLayer


class UpstreamSend(LocalChannelLayer):
    send = InMemoryChannelLayer.send
    receive = InMemoryChannelLayer.receive


async def per_hop(layer_class, messages: int) -> float:
    """Microseconds per group_send + receive."""
    layer = layer_class()
    channel = await layer.new_channel()
    await layer.group_add("chat-1", channel)
    message = {"type": "chat.fragment", "html": "<div>" + "x" * 2000 + "</div>"}
    start = time.perf_counter()
    for _ in range(messages):
        await layer.group_send("chat-1", message)
        await layer.receive(channel)
    return (time.perf_counter() - start) / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"Channels' send and receive": [], "Studio's": []}
    for _ in range(args.runs):
        times["Channels' send and receive"].append(
            asyncio.run(per_hop(UpstreamSend, args.messages))
        )
        times["Studio's"].append(asyncio.run(per_hop(LocalChannelLayer, args.messages)))
    for name, values in times.items():
        print(f"{name:28s} {statistics.median(values):6.2f} µs per group_send + receive")


if __name__ == "__main__":
    main()
