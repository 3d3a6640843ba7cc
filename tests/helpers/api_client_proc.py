"""A separate process using the shipped client (studio_approvals) as an agent would.

argv: url token mode [tool [arguments-json]]. Prints "asking", then one
JSON line: the decision, or {"denied": ...}, {"undecided": ...} or
{"error": ...}. Modes: approve (blocking), async (approve_async through
AsyncClient), decorated (a function under @require_approval, which prints
what it ran with).
"""

from __future__ import annotations

import asyncio
import json
import sys

from studio_approvals import AsyncClient, Client, Denied, StudioError, Undecided, require_approval


def main() -> None:
    url, token, mode = sys.argv[1:4]
    tool = sys.argv[4] if len(sys.argv) > 4 else "deploy"
    arguments = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {"env": "prod"}
    print("asking", flush=True)
    try:
        if mode == "approve":
            with Client(url, token) as client:
                decision = client.approve(tool, arguments, title="Ship it", timeout=90)
            out = {"status": decision.status, "arguments": decision.arguments,
                   "decided_by": decision.decided_by, "id": decision.id}  # fmt: skip
        elif mode == "async":

            async def ask():
                async with AsyncClient(url, token) as client:
                    return await client.approve(tool, arguments, title="Ship it", timeout=90)

            decision = asyncio.run(ask())
            out = {"status": decision.status, "arguments": decision.arguments}
        else:
            client = Client(url, token)

            @require_approval(tool, client=client, timeout=90)
            def deploy(env: str) -> str:
                return f"deployed to {env}"

            out = {"ran": deploy(**arguments)}
    except Denied as exc:
        out = {"denied": str(exc), "reason": exc.decision.reason}
    except Undecided as exc:
        out = {"undecided": exc.approval_id}
    except StudioError as exc:
        out = {"error": str(exc), "status": exc.status}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
