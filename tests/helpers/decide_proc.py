"""Child process: decide one approval when the parent says "go".

Usage: decide_proc.py APPROVAL_ID USERNAME DECISION
Prints "ready", waits for a line on stdin, decides, prints a JSON result.
"""

from __future__ import annotations

import json
import sys

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402

from approvals.services.decisions import approval_decide  # noqa: E402


def main() -> None:
    approval_id, username, decision = sys.argv[1:4]
    user = get_user_model().objects.get(username=username)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    result = approval_decide(approval_id=approval_id, user=user, decision=decision)
    print(json.dumps({"resolved": result.resolved, "status": result.approval.status}), flush=True)


if __name__ == "__main__":
    main()
