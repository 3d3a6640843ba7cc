"""A process that recorded a decision and stopped before answering it (a
restart): nginx (deploy/nginx-site.conf) sends the POST on to the next
process, and its member hears the decision they made, not a 409."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from approvals.models import ToolApproval
from deploy.cluster import free_port
from deploy.proxy import LocalNginx
from tests.factories import PASSWORD, make_approval, make_conversation, make_live_member
from tests.helpers.live import LiveServer
from tests.helpers.services import cluster_env

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

BOUND = 30  # seconds, for any one step


class StopsAfterFirstDecision:
    """Stands between nginx and daphne on two ports, as two processes. The
    first decision POST it carries reaches daphne, and daphne's answer is
    dropped with the connection: what nginx sees of a process that stops
    between recording a decision and answering it. Everything else passes."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self.ports = [free_port(), free_port()]
        self.decisions: list[str] = []  # each decision POST's request line, in order
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.servers: list[asyncio.Server] = []

    def __enter__(self) -> StopsAfterFirstDecision:
        self.thread.start()
        for port in self.ports:
            listen = asyncio.start_server(self._carry, "127.0.0.1", port)
            server = asyncio.run_coroutine_threadsafe(listen, self.loop).result(BOUND)
            self.servers.append(server)
        return self

    def __exit__(self, *exc) -> None:
        async def close() -> None:
            for server in self.servers:
                server.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(BOUND)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(BOUND)

    async def _carry(self, reader, writer) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
            up_writer.write(head)
            line = head.split(b"\r\n", 1)[0].decode()
            if line.startswith("POST ") and "/decide/" in line:
                self.decisions.append(line)
                if len(self.decisions) == 1:
                    length = next(
                        int(h.split(b":", 1)[1])
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length:")
                    )
                    up_writer.write(await reader.readexactly(length))
                    await asyncio.wait_for(up_reader.read(), BOUND)  # the answer, recorded
                    up_writer.close()
                    writer.transport.abort()
                    return
            await asyncio.wait(
                [
                    asyncio.create_task(_pipe(reader, up_writer)),
                    asyncio.create_task(_pipe(up_reader, writer)),
                ],
                timeout=BOUND,
                return_when=asyncio.FIRST_COMPLETED,
            )
            up_writer.close()
        finally:
            writer.close()


async def _pipe(reader, writer) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


def test_a_decision_whose_process_stopped_before_answering_is_not_a_409(
    redis_server, workspace_root, tmp_path, settings
):
    member = make_live_member(settings, "erin")
    conversation = make_conversation(member)
    approval = make_approval(conversation, arguments={"code": "print(1)"})
    env = {**cluster_env(redis_server.url, workspace_root), "STUDIO_HTTPS": "True"}
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    server = LiveServer(log_path=tmp_path / "daphne.log", **env).start()
    try:
        with StopsAfterFirstDecision(server.port) as shim:
            proxy = LocalNginx(prefix, shim.ports, tmp_path).start()
            try:
                http = httpx.Client(base_url=proxy.url, verify=proxy.ssl, timeout=BOUND)
                http.get("/accounts/login/")
                origin = {"Origin": proxy.url}
                login = http.post(
                    "/accounts/login/",
                    data={"username": "erin", "password": PASSWORD,
                          "csrfmiddlewaretoken": http.cookies["csrftoken"]},
                    headers=origin,
                )  # fmt: skip
                assert login.status_code == 302, login.text
                answer = http.post(
                    f"/approvals/{approval.approval_id}/decide/",
                    data={"decision": "deny", "note": "not now"},
                    headers={**origin, "Accept": "application/json",
                             "X-CSRFToken": http.cookies["csrftoken"]},
                )  # fmt: skip
            finally:
                proxy.stop()
    finally:
        server.stop()

    assert len(shim.decisions) == 2  # the first copy, then nginx's repeat of it
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"resolved": True, "status": "denied", "reason": "user"}
    row = ToolApproval.objects.get(pk=approval.pk)
    assert (row.status, row.note) == ("denied", "not now")
    assert row.decided_request_id == answer.headers["X-Request-ID"]
    assert "prematurely closed" in (prefix / "logs" / "error.log").read_text()
