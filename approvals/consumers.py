"""A member's sockets: the live header count on every page, and the approvals inbox."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer

from approvals.inbox import count_badge, inbox_change, inbox_count, inbox_refresh, inbox_state
from approvals.models import can_review
from approvals.notify import REVIEWERS_GROUP, member_group
from studio.runtime import runtime
from studio.sessions import session_digest, session_user

logger = logging.getLogger(__name__)

# A page other than the inbox gathers the changes of this long into one count
# query: a card asked and decided within it costs one, Allow all of ten costs
# one, and the count never competes with the decided call's own work.
REFRESH_SECONDS = 0.1

# Close codes the page understands (studio.js): it stops reconnecting and says why.
CLOSE_LOGGED_OUT = 4401
CLOSE_NOT_FOUND = 4404
# Not final: the page reconnects at once.
CLOSE_ROLES_CHANGED = 4409

SESSION_ENDED = "Your session has ended (logged out, or the account changed). Log in again."


async def off_loop(fn, *args, **kwargs):
    """Database work for a socket, on the runtime's pool (not the one sync thread)."""
    return await runtime().off_loop(fn, *args, **kwargs)


def _session_alive(session_key: str | None, user_id: int) -> bool:
    user = session_user(session_key)
    return user.is_authenticated and user.pk == user_id


def _member_groups(user) -> list[str]:
    groups = [member_group(user.pk)]
    if can_review(user):
        groups.append(REVIEWERS_GROUP)
    return groups


class MemberSocket(AsyncWebsocketConsumer):
    """One tab of one member: their group (and the reviewers'), kept current.

    It joins its groups before accepting and sends the full state on every
    connect (and after Redis forgot the groups), so nothing that happened
    since the page was rendered is missed. It acts only while its session
    still logs the member in. Subclasses say what else the socket is for
    (``admit``), which groups it joins and what its state is.

    The socket opens and closes its channel itself (``listen``): Channels'
    own loop can end a consumer just after a message reached its channel,
    and channels-redis's Pub/Sub layer then keeps that channel, a queue and a
    Redis subscription, for as long as the process lives (half the sockets
    or more in bench/soak.py). The layer drops a channel when a receive
    waiting on it is cancelled; here one task only ever waits in receive.
    """

    # No channel from Channels' loop: ``listen`` opens one once the socket is admitted.
    channel_layer_alias = None
    listening: asyncio.Task | None = None
    delivering: asyncio.Task | None = None
    user = None
    joined: list[str] = []
    with_cards = False  # the inbox page: its entries are live too
    refresh: asyncio.Task | None = None
    came: list[str] = []  # approvals that came since the last refresh (notifications)
    touched: list[str] = []  # approvals that came or went since the last refresh
    dirty = False  # a change since the last refresh began

    async def __call__(self, scope, receive, send) -> None:
        # Channel messages and the socket's own are handled one at a time, as
        # in Channels' loop: a fragment never overtakes the catch-up.
        self.dispatching = asyncio.Lock()
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.stop_listening()

    async def dispatch(self, message: dict) -> None:
        """The message's handler, without Channels' hop to close old connections.

        Channels' ``dispatch`` first closes stale database connections on the
        process's one sync thread, for every message of every socket: each
        costs two thread switches, and a fragment waits behind other sockets'
        session loads. A socket's database work is on the runtime's pools,
        which give each connection back when done.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']!r}")
        async with self.dispatching:
            await handler(message)

    async def listen(self) -> None:
        """Open the socket's channel; its messages are dispatched in order."""
        self.channel_layer = get_channel_layer()
        self.channel_name = await self.channel_layer.new_channel()
        arrived: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.listening = loop.create_task(self._receive(arrived))
        self.delivering = loop.create_task(self._deliver(arrived))
        # One turn of the loop (it runs tasks in the order they were made):
        # the receive is now waiting, so any cancel from here on reaches it.
        await asyncio.sleep(0)

    async def _receive(self, arrived: asyncio.Queue) -> None:
        # Nothing but receive() is awaited here, so a cancel always finds this
        # task inside it: the layer's cue to drop the channel.
        while True:
            arrived.put_nowait(await self.channel_layer.receive(self.channel_name))

    async def _deliver(self, arrived: asyncio.Queue) -> None:
        while True:
            message = await arrived.get()
            try:
                await self.dispatch(message)
            except Exception:
                # Most often a send racing the tab's own close. Otherwise close
                # the socket, as Channels' loop would: the page reconnects (on
                # any code but its final ones) and is caught up.
                logger.warning("socket: handling %r failed", message.get("type"), exc_info=True)
                await self.close()
                return

    async def stop_listening(self) -> None:
        """Close the channel (a no-op once closed)."""
        tasks = [t for t in (self.listening, self.delivering) if t is not None]
        self.listening = self.delivering = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def connect(self) -> None:
        # Refusals accept first and then close, so the page learns the code.
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.accept()
            await self.close(code=CLOSE_LOGGED_OUT)
            return
        await runtime().start()
        self.user = user
        joined = await off_loop(self.opening)
        if joined is None:
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.joined = joined
        await self.listen()
        runtime().inbox.on_layer_reset(self._rejoin)
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_state()

    def opening(self) -> list[str] | None:
        """The groups to join, or None to refuse the socket (404); one trip off the loop."""
        return self.groups_to_join() if self.admit() else None

    def admit(self) -> bool:
        """Look up what the socket is for; False refuses it (runs off the loop)."""
        return True

    def groups_to_join(self) -> list[str]:
        return _member_groups(self.user)

    def state(self) -> list[str]:
        """Everything the tab needs to be current, as the frames to send (runs off the loop)."""
        if self.with_cards:
            return [inbox_state(self.user)]
        return [count_badge(inbox_count(self.user))]

    async def send_state(self) -> None:
        for frame in await off_loop(self.state):
            await self.send(text_data=frame)

    async def disconnect(self, code: int) -> None:
        if self.refresh is not None:
            self.refresh.cancel()
        if self.joined:
            runtime().inbox.off_layer_reset(self._rejoin)
            for group in self.joined:
                await self.channel_layer.group_discard(group, self.channel_name)
        await self.stop_listening()

    async def _rejoin(self) -> None:
        """Redis restarted and forgot our groups: join again and catch the tab up."""
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.send_state()

    async def _session_ended(self, *, ended: str = "") -> bool:
        """Close the socket, saying why, when its session no longer logs the member in."""
        session = self.scope.get("session")
        key = session.session_key if session is not None else None
        if not (ended and ended == session_digest(key)) and await off_loop(
            _session_alive, key, self.user.pk
        ):
            return False
        await self.notice(SESSION_ENDED)
        await self.close(code=CLOSE_LOGGED_OUT)
        return True

    async def notice(self, text: str, *, level: str = "error") -> None:
        """Pages without a notice area have nothing to show; the close code says it."""

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self._session_ended()  # a member socket takes no actions

    # -- group events -----------------------------------------------------------------

    async def session_check(self, event: dict) -> None:
        """The member logged out or their account changed somewhere: re-check now."""
        await self._session_ended(ended=event.get("ended", ""))

    async def roles_changed(self, event: dict) -> None:
        """The member's roles changed at a sign-in: reconnect, to join what they give now."""
        await self.close(code=CLOSE_ROLES_CHANGED)

    async def rule_hit(self, event: dict) -> None:
        """A rule of the member's was used: only a chat tab shows the count."""

    async def inbox_changed(self, event: dict) -> None:
        approval_id = str(event.get("approval_id", ""))
        pending = bool(event.get("pending"))
        if self.with_cards:
            html = await off_loop(inbox_change, self.user, approval_id=approval_id, pending=pending)
            await self.send(text_data=html)
            return
        if pending:
            self.came = [*self.came, approval_id]
        self.touched = [*self.touched, approval_id]
        self.dirty = True
        if self.refresh is None:
            self.refresh = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        """The count (and a notification) once a burst of changes has settled."""
        try:
            while self.dirty:
                await self.settle()
                came, touched = self.came, self.touched
                self.came, self.touched, self.dirty = [], [], False
                await self.send(text_data=await off_loop(self.refreshed, came, touched))
        except Exception:
            # A closed socket or an unreachable database: the next change or
            # the next connect sends the count again.
            logger.warning("inbox count refresh failed", exc_info=True)
        finally:
            self.refresh = None

    def refreshed(self, came: list[str], touched: list[str]) -> str:
        """What the tab shows after a burst of changes (runs off the loop)."""
        return inbox_refresh(self.user, came=came)

    async def settle(self) -> None:
        """Let a burst of changes gather."""
        await asyncio.sleep(REFRESH_SECONDS)


class InboxConsumer(MemberSocket):
    """The approvals inbox page: its cards come and go live."""

    with_cards = True
