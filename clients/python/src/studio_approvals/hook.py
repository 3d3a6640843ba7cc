"""Claude Code's PreToolUse hook: ask Studio, answer allow, deny or ask.

Claude Code runs it before each matching tool call with the call as JSON on
stdin and reads the decision from stdout (``hookSpecificOutput``). A shell
command (``Bash``) is asked as Studio's ``terminal`` tool and a page fetch
(``WebFetch``) as ``web_fetch``, so the team's rules read them as they read
the chat's; any other tool is asked under its own name with its input.
When Studio cannot answer in time, the terminal's own prompt decides
("ask"), unless STUDIO_HOOK_ON_ERROR=deny.
"""

from __future__ import annotations

import json
import os
import sys

from studio_approvals.client import Client, Denied, StudioError, Undecided


def studio_call(tool_name: str, tool_input: dict) -> tuple[str, dict]:
    """The Studio tool and arguments a Claude Code call is asked as."""
    if tool_name == "Bash" and isinstance(tool_input.get("command"), str):
        return "terminal", {"command": tool_input["command"]}
    if tool_name == "WebFetch" and isinstance(tool_input.get("url"), str):
        return "web_fetch", {"url": tool_input["url"]}
    return tool_name, tool_input


def claude_input(tool_name: str, tool_input: dict, approved: dict) -> dict:
    """The call's input with what was approved (a person may have edited it)."""
    if tool_name == "Bash":
        return {**tool_input, "command": approved["command"]}
    if tool_name == "WebFetch":
        return {**tool_input, "url": approved["url"]}
    return approved


def decide(event: dict, client: Client, wait: float) -> dict:
    tool_name = str(event.get("tool_name") or "")
    tool_input = event.get("tool_input") or {}
    tool, arguments = studio_call(tool_name, tool_input)
    session, call = event.get("session_id") or "", event.get("tool_use_id") or ""
    title = tool_input.get("description") or f"Claude Code: {tool_name}"
    out: dict = {"hookEventName": "PreToolUse"}
    try:
        decision = client.approve(
            tool,
            arguments,
            timeout=wait,
            title=str(title)[:200],
            # Claude Code retrying the same call finds the same approval.
            idempotency_key=f"claude-code:{session}:{call}"[:100] if call else None,
        )
    except Denied as exc:
        d = exc.decision
        out["permissionDecision"] = "deny"
        out["permissionDecisionReason"] = (
            f"Studio: denied{' by ' + d.decided_by if d.decided_by else ''} ({d.reason_label})"
            + (f": {d.note}" if d.note else "")
        )
        return out
    except Undecided:
        out["permissionDecision"] = "ask"
        out["permissionDecisionReason"] = f"Studio: no decision within {wait:.0f} s"
        return out
    out["permissionDecision"] = "allow"
    out["permissionDecisionReason"] = (
        f"Studio: allowed by {decision.decided_by or 'a rule'} ({decision.reason_label})"
    )
    if decision.edited and decision.arguments is not None:
        out["updatedInput"] = claude_input(tool_name, tool_input, decision.arguments)
    return out


def main() -> int:
    wait = float(os.environ.get("STUDIO_HOOK_WAIT", "300"))
    on_error = os.environ.get("STUDIO_HOOK_ON_ERROR", "ask")
    try:
        event = json.load(sys.stdin)
        if not isinstance(event, dict):
            raise ValueError("the hook's input is not a JSON object")
        with Client() as client:
            out = decide(event, client, wait)
    except (StudioError, ValueError) as exc:
        out = {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny" if on_error == "deny" else "ask",
            "permissionDecisionReason": f"Studio could not decide: {exc}",
        }
    json.dump({"hookSpecificOutput": out}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
