"""Peer (c): the origin's architecture on FastAPI/uvicorn.

A chat request streams Server-Sent Events; the agent is a generator stepped
with ``asyncio.to_thread(next, generator)``; a gated call registers a
``threading.Event`` waiter before it announces itself, then blocks *inside
the generator* (so inside a default-executor thread) until the decision POST
sets the event.

    uvicorn bench.peers.origin_peer:app
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

app = FastAPI()
WAITERS: dict[str, threading.Event] = {}


def agent(text: str):
    approval_id = secrets.token_urlsafe(16)
    event = WAITERS[approval_id] = threading.Event()  # registered before tool_start
    yield {"type": "tool_start", "approval_id": approval_id}
    event.wait(3600)
    del WAITERS[approval_id]
    yield {"type": "tool_end", "result": text}
    yield {"type": "done"}


@app.post("/chat")
async def chat(body: dict):
    generator = agent(body["message"])

    async def events():
        while True:
            try:
                event = await asyncio.to_thread(next, generator)
            except RuntimeError:  # StopIteration inside to_thread
                return
            yield f"data: {json.dumps(event)}\n\n"
            if event["type"] == "done":
                return

    return StreamingResponse(events(), media_type="text/event-stream")


@app.post("/approvals/{approval_id}/decide/")
async def decide(approval_id: str):
    event = WAITERS.get(approval_id)
    if event is None:
        return JSONResponse({"resolved": False}, status_code=409)
    event.set()
    return {"resolved": True}
