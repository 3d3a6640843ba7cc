"""Child process: send a member's message from a process that serves no loop
(as a WSGI worker does) when the parent says "go".

Usage: launch_proc.py CONVERSATION_ID USERNAME TEXT
Prints "ready", waits for a line on stdin, launches, prints a JSON result.
"""

from __future__ import annotations

import json
import sys

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402

from chat.runs.commands import run_launch  # noqa: E402


def main() -> None:
    conversation_id, username, text = sys.argv[1:4]
    user = get_user_model().objects.get(username=username)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    launch = run_launch(conversation_id=int(conversation_id), user=user, text=text)
    print(json.dumps({"ok": launch.ok, "reason": launch.reason}), flush=True)


if __name__ == "__main__":
    main()
