"""A gated call through nginx on the host the README's Production steps built.

Run inside that host (``tests/fresh_host/run.py`` starts it there) as
``.venv/bin/python -m tests.fresh_host.gated_call USER PASSWORD``: a model
on ``LLM_BASE_URL`` (the example environment's 127.0.0.1:8080) asks for a
terminal call, the member allows it over HTTPS through the nginx site, and
the call's output comes back. Also checks what an anonymous visitor sees.
Exits non-zero, saying why, on the first thing that is not as the README says.
"""

from __future__ import annotations

import json
import re
import sys
import time

import httpx

from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks, tool_call_chunks

SITE = "https://studio.example.com"
CERTIFICATE = "/etc/letsencrypt/live/studio.example.com/fullchain.pem"
# The shell works this out, so the answer is in the output only if the call ran.
COMMAND = "echo fresh-host-$((6 * 7)) as $(id -un)"
RAN = "fresh-host-42"


def reply_for(request: dict) -> Reply:
    """Ask for the call first, then answer once its result is in; titles get a title."""
    messages = request.get("messages") or []
    if not request.get("tools"):
        return Reply(chunks=content_chunks("Fresh host"))
    if messages and messages[-1].get("role") == "tool":
        return Reply(chunks=content_chunks("The call ran."))
    arguments = json.dumps({"command": COMMAND})
    return Reply(chunks=tool_call_chunks(0, "call_fresh", "terminal", arguments))


def check(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"fresh host: {what}")


def wait_for(client: httpx.Client, url: str, pattern: str, what: str) -> re.Match:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(pattern, client.get(url).text)
        if found:
            return found
        time.sleep(0.5)
    sys.exit(f"fresh host: {what} did not show on {url} within 60 s")


def main(username: str, password: str) -> None:
    anonymous = httpx.Client(verify=CERTIFICATE, timeout=10)
    ready = anonymous.get(f"{SITE}/readyz")
    check(ready.status_code == 200, f"/readyz answered {ready.status_code}: {ready.text[:200]}")
    plain = anonymous.get("http://studio.example.com/accounts/login/")
    check(plain.status_code == 301, f"port 80 answered {plain.status_code}, not a redirect")
    check(plain.headers["location"].startswith(SITE), "port 80 redirects elsewhere")
    for response in (
        anonymous.get(f"{SITE}/no-such-page/"),
        httpx.get("http://127.0.0.1:8001/", headers={"Host": "evil.example"}),
    ):
        check(response.status_code in (400, 404), f"{response.url} gave {response.status_code}")
        for leak in ("Traceback", "DATABASE_URL", "change-me", "settings.py"):
            check(leak not in response.text, f"{response.url} shows {leak!r}: debug is on")

    member = httpx.Client(
        verify=CERTIFICATE, timeout=10, follow_redirects=True, headers={"Origin": SITE}
    )
    login = member.get(f"{SITE}/accounts/login/")
    token = member.cookies["csrftoken"]
    signed_in = member.post(
        login.url,
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
    )
    check("sessionid" in member.cookies, f"login refused ({signed_in.status_code})")
    headers = {"X-CSRFToken": member.cookies["csrftoken"]}
    chat = member.post(f"{SITE}/c/new/", headers=headers)
    check(re.search(r"/c/\d+/$", str(chat.url)) is not None, f"no new chat: {chat.url}")
    page = str(chat.url)
    sent = member.post(f"{page}send/", data={"message": "Run it."}, headers=headers)
    check(sent.status_code == 200, f"send answered {sent.status_code}")

    decide = wait_for(member, page, r"/approvals/([\w-]+)/decide/", "the call's card")
    allowed = member.post(
        f"{SITE}{decide.group(0)}",
        data={"decision": "allow"},
        headers={**headers, "Accept": "application/json"},
    )
    check(allowed.status_code == 200, f"Allow answered {allowed.status_code}: {allowed.text}")
    ran = wait_for(member, page, RAN + r" as (\S+)", "the call's output")
    print(f"fresh host: the call ran in the sandbox as {ran.group(1)}, through nginx")


if __name__ == "__main__":
    with FakeOpenAI(("your-model",), port=8080, respond=reply_for):
        main(*sys.argv[1:3])
