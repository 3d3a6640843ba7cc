"""Process-wide state in one typed object, made once when the process starts.

``runtime()`` returns the process's ``Runtime``: the approval gate, the
worker pools, the channel-layer outbox and inbox, and the table of runs this
process hosts. Its asyncio parts start on the server's event loop the first
time a request or socket arrives (``await runtime().start()``); nothing here
is created at import time or sized from settings read at import.

Apps plug their behaviour in at start-up (``AppConfig.ready``): approvals
registers the inbox's ``approval.decided`` handler and the poll; chat its
``run.cancel`` handler, heartbeat and shutdown. So this module imports
neither app's services.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asgiref.sync import async_to_sync, sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from approvals.gate import Gate
from studio.cancel import CancelToken

if TYPE_CHECKING:
    from chat.tools.mcp import McpHub

logger = logging.getLogger(__name__)


class DaemonPool(Executor):
    """A bounded pool of daemon threads, started as work arrives.

    Like ``ThreadPoolExecutor``, except that its threads never hold up the
    process's exit: a run stuck in a model call must not keep a SIGTERMed
    server alive (``ThreadPoolExecutor`` joins its threads at exit).
    """

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads = 0
        self._busy = 0
        self._lock = threading.Lock()

    @property
    def busy(self) -> int:
        """Threads running a task now."""
        return self._busy

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        # An idle thread takes it; otherwise start one, up to the bound.
        if not self._idle.acquire(timeout=0):
            with self._lock:
                if self._threads < self.workers:
                    self._threads += 1
                    name = f"{self.name}-{self._threads}"
                    threading.Thread(target=self._work, name=name, daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            future, fn, args, kwargs = self._queue.get()
            if future.set_running_or_notify_cancel():
                with self._lock:
                    self._busy += 1
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)
                finally:
                    with self._lock:
                        self._busy -= 1
            del future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to do: daemon threads end with the process."""


def release_connection() -> None:
    """End of a unit of work on a pool thread.

    A PostgreSQL connection goes back to its pool (a parked run must hold
    none); SQLite's stays open (reopening costs more than the work).
    """
    if connection.vendor != "sqlite" and not connection.in_atomic_block:
        connection.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Later:
    """A delayed send (``Outbox.group_later``): either taken back or sent, once."""

    def __init__(self, message: dict) -> None:
        self.message = message
        self._lock = threading.Lock()
        self._done = False

    @property
    def settled(self) -> bool:
        """Taken back or sent."""
        return self._done

    def take_back(self) -> bool:
        """True if it was not sent and now never will be; False if it is on its way.

        On its way means already in the outbox's queue: whatever the caller
        sends next goes after it.
        """
        return self._finish()

    def fire(self) -> bool:
        """(The outbox, when the delay is up.) True if it is to be sent now."""
        return self._finish()

    def _finish(self) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
            return True


class Outbox:
    """Channel-layer sends from any thread, in order, without blocking the sender.

    Delivery is at most once (the row is the truth): a send that fails is
    logged and dropped. With no server loop running (a management command, a
    plain test) a send is made synchronously instead.

    Delayed sends (``group_later``) share one timer on the loop, set for the
    earliest one still to go. A worker thread wakes the loop only when its
    send is due before that: a status line or a card taken back a moment
    later (most of them) costs the loop nothing, where a timer of its own
    cost two turns of the loop, one to set it and one to fire it.
    """

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        # Delayed sends: a heap of (due, seq, Later, item), on loop.time().
        self._timers: list[tuple] = []
        self._timers_lock = threading.Lock()
        self._seq = itertools.count()
        # When the loop's timer fires next (inf: not set), and its handle.
        self._wake_at = math.inf
        self._handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue = asyncio.Queue()
        self._task = loop.create_task(self._drain(self._queue))

    async def close(self) -> None:
        if self._task is not None:
            await _cancel([self._task])
        if self._handle is not None:
            self._handle.cancel()
        with self._timers_lock:
            self._timers.clear()
            self._wake_at, self._handle = math.inf, None
        self.loop = self._queue = self._task = None

    def group(self, group: str, message: dict, *, wait: bool = False) -> None:
        """Send to a group. ``wait``: return once it is delivered (from a worker thread).

        A run waits for its own fragments: the wait gives the loop the GIL to
        deliver them at once, instead of competing with the rest of the run's
        work while the member looks at a stale card.
        """
        if not wait:
            self._put(("group", group, message, None))
            return
        done: Future = Future()
        self._put(("group", group, message, done))
        with contextlib.suppress(Exception):
            done.result(timeout=10)

    def group_later(self, group: str, message: dict, delay: float) -> Later:
        """Send to a group in ``delay`` seconds, unless ``Later.take_back()`` comes first.

        A run's status line ("Running python…") is worth a message only when
        what it announces takes a while: a quick step takes it back and sends
        it with its next fragments instead. A message nobody takes back just
        steps aside for what is sent meanwhile (the inboxes' change notices,
        see ``approvals.services.decisions.inbox_broadcast``). With no server loop it
        is sent now.
        """
        later = Later(message)
        item = ("group", group, message, None)
        loop, q = self.loop, self._queue
        if loop is None or q is None or loop.is_closed() or not loop.is_running():
            later.fire()
            self._put(item)
            return later
        due = loop.time() + delay
        with self._timers_lock:
            heapq.heappush(self._timers, (due, next(self._seq), later, item))
            sooner = due < self._wake_at
            if sooner:
                self._wake_at = due  # the timer is being set for this one or sooner
        if sooner:
            if _running_loop() is loop:
                self._set_timer()
            else:
                loop.call_soon_threadsafe(self._set_timer)
        return later

    def _set_timer(self) -> None:
        """(On the loop.) Set the one timer for the earliest delayed send still to go."""
        loop = self.loop
        if loop is None:
            return
        with self._timers_lock:
            while self._timers and self._timers[0][2].settled:
                heapq.heappop(self._timers)  # taken back: nothing to wake for
            due = self._timers[0][0] if self._timers else math.inf
            self._wake_at = due
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None if due == math.inf else loop.call_at(due, self._fire_due)

    def _fire_due(self) -> None:
        """(On the loop.) Send every delayed message whose time has come, then reset the timer."""
        self._handle = None
        now = self.loop.time()
        due = []
        with self._timers_lock:
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers))
            self._wake_at = math.inf
        for _, _, later, item in due:
            if later.fire():
                self._queue.put_nowait(item)
        self._set_timer()

    def channel(self, channel: str, message: dict) -> None:
        if channel:
            self._put(("channel", channel, message, None))

    def _put(self, item: tuple) -> None:
        loop, q = self.loop, self._queue
        running = _running_loop()
        if loop is None or q is None or loop.is_closed() or not loop.is_running():
            deliver = async_to_sync(self._deliver)
            if running is None:
                deliver(item)
                if item[3] is not None:
                    item[3].set_result(None)
            else:
                # Some other loop runs in this thread (a test driving a
                # browser): deliver from a thread of its own.
                thread = threading.Thread(target=deliver, args=(item,), daemon=True)
                thread.start()
                thread.join(10)
                if item[3] is not None:
                    item[3].set_result(None)
        elif running is loop:
            if item[3] is not None:  # waiting on the loop's own thread would deadlock
                item = (*item[:3], None)
            q.put_nowait(item)
        else:
            loop.call_soon_threadsafe(q.put_nowait, item)

    async def _drain(self, q: asyncio.Queue) -> None:
        while True:
            item = await q.get()
            try:
                await self._deliver(item)
                if item[3] is not None:
                    # Let the local consumers forward it to their sockets
                    # before the waiting run takes the GIL back.
                    for _ in range(4):
                        await asyncio.sleep(0)
            finally:
                if item[3] is not None:
                    item[3].set_result(None)

    @staticmethod
    async def _deliver(item: tuple) -> None:
        kind, target, message, _ = item
        layer = get_channel_layer()
        if layer is None:
            return
        send = layer.group_send if kind == "group" else layer.send
        for attempt in (1, 2):
            try:
                await send(target, message)
                return
            except ChannelFull:
                logger.warning("%s %s is full; %s dropped", kind, target, message.get("type"))
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                # A connection Redis closed (it restarted): one retry on a fresh one.
                if attempt == 2:
                    logger.warning(
                        "%s send to %s failed; %s dropped",
                        kind,
                        target,
                        message.get("type"),
                        exc_info=True,
                    )


class Inbox:
    """This process's own channel, and the tasks that serve it.

    Rows record the inbox of the process whose run waits on them; decisions
    and Stops made in another process are sent here. A poll re-reads the
    waiting rows in case such a message was lost, and (with Redis) a watcher
    notices a Redis restart so sockets can re-join their groups.
    """

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, Callable[[dict], None]] = {}
        # Re-reads this process's waiting rows; set by approvals at start-up.
        self.poll: Callable[[], object] | None = None
        self._tasks: list[asyncio.Task] = []
        # Bound methods called (on the loop) when Redis restarted and lost
        # every group. Weak: a consumer that crashed without disconnect()
        # must not linger.
        self._reset_callbacks: dict[int, weakref.WeakMethod] = {}

    def register(self, message_type: str, handler: Callable[[dict], None]) -> None:
        self.handlers[message_type] = handler

    def on_layer_reset(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._reset_callbacks[id(callback.__self__)] = weakref.WeakMethod(callback)

    def off_layer_reset(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._reset_callbacks.pop(id(callback.__self__), None)

    async def open(self, loop: asyncio.AbstractEventLoop, rt: Runtime) -> None:
        layer = get_channel_layer()
        # Default prefix on purpose: a layer may treat a process's "specific."
        # channels as one (channels-redis's core layer receives them through
        # one list under one lock, which another prefix would hold alone).
        self.name = await layer.new_channel()
        self._tasks = [loop.create_task(self._listen(layer, self.name))]
        if self.poll is not None:
            self._tasks.append(loop.create_task(self._poll(rt)))
        if settings.REDIS_URL:
            self._tasks.append(
                loop.create_task(
                    self._watch_redis(settings.REDIS_URL, settings.STUDIO_LAYER_WATCH_SECONDS)
                )
            )

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        self.name = ""
        await _cancel(tasks)

    def dispatch(self, message: dict) -> None:
        handler = self.handlers.get(message.get("type", ""))
        if handler is None:
            logger.warning("inbox: no handler for %r", message.get("type"))
            return
        try:
            handler(message)
        except Exception:
            logger.exception("inbox: handler for %r failed", message.get("type"))

    async def _listen(self, layer, name: str) -> None:
        delay = 0.1
        while True:
            try:
                message = await layer.receive(name)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Redis restarting: keep trying; the poll covers waiters meanwhile.
                logger.warning("inbox %s: receive failed; retrying in %.1fs", name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            self.dispatch(message)

    async def _poll(self, rt: Runtime) -> None:
        while True:
            try:
                await rt.off_loop(self.poll)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Database down: parked runs notice the poller is stale and check themselves.
                logger.warning("approval poller failed", exc_info=True)
            await asyncio.sleep(settings.STUDIO_APPROVAL_POLL_SECONDS)

    async def _watch_redis(self, url: str, interval: float) -> None:
        """Notice a Redis restart (its run_id changes) and tell the consumers.

        Redis keeps nothing on disk here, and what was published while it
        was down reached nobody: each consumer joins its groups again (the
        Pub/Sub client also re-subscribes by itself) and re-sends its tab the
        current state.
        One INFO call per process per interval, whatever the number of sockets.
        """
        import redis.asyncio as aioredis

        client = aioredis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        last = None
        try:
            while True:
                try:
                    run_id = (await client.info("server")).get("run_id")
                except asyncio.CancelledError:
                    raise
                except Exception:
                    run_id = None  # down for now; compare again once it is back
                if run_id and last and run_id != last:
                    await self._listening_again(client)
                    callbacks = [ref() for ref in list(self._reset_callbacks.values())]
                    callbacks = [c for c in callbacks if c is not None]
                    logger.warning("Redis restarted: re-joining %d socket(s)", len(callbacks))
                    for callback in callbacks:
                        try:
                            await callback()
                        except Exception:
                            logger.warning("layer reset callback failed", exc_info=True)
                if run_id:
                    last = run_id
                await asyncio.sleep(interval)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _listening_again(self, client, timeout: float = 10.0) -> None:
        """After a Redis restart, wait until this process is subscribed again.

        The Pub/Sub client re-subscribes by itself once it reconnects (all of
        a process's channels and groups at once, on one connection), and what
        is published before that reaches nobody: a tab caught up earlier would
        miss everything between its catch-up and that moment. The inbox
        channel counting a subscriber again says the process listens.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            with contextlib.suppress(Exception):  # down again: keep looking
                counts = await client.pubsub_numsub(self.name)
                if counts and counts[0][1] >= 1:
                    return
            await asyncio.sleep(0.05)
        logger.warning("Redis restarted and this process is not subscribed again yet")


async def _cancel(tasks: list[asyncio.Task], timeout: float = 2.0) -> None:
    """Cancel ``tasks`` and give them a moment to finish; never hang on one.

    (channels-redis's ``receive`` can take its time to notice a cancel.)
    """
    for task in tasks:
        task.cancel()
    if tasks:
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, timeout=timeout)


@dataclass(eq=False)
class LocalRun:
    """A run this process hosts: its cancel token and the task that drives it."""

    run_id: str
    conversation_id: int
    cancel: CancelToken = field(default_factory=CancelToken)
    task: asyncio.Task | None = None
    # Parked on a decision (holding no thread) rather than working.
    parked: bool = False
    # What the launch wrote (the run's row and the user's message), for the
    # run's first step to use instead of reading them back.
    launched: tuple | None = None


class Runtime:
    """Everything this process keeps between requests (see the module docstring)."""

    def __init__(self, *, agent_workers: int) -> None:
        self.gate = Gate()
        # Runs that are *working*; a parked run holds none of these.
        self.agent_pool = DaemonPool(agent_workers, "studio-agent")
        # Short database work off the loop (sockets, the poller, the heartbeat):
        # never queued behind a full agent pool.
        self.io_pool = DaemonPool(4, "studio-io")
        self.outbox = Outbox()
        self.inbox = Inbox()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.runs: dict[str, LocalRun] = {}
        # Loop-bound services the apps add (chat's heartbeat), and their
        # wind-down before the process exits (chat cancels its runs).
        self.services: list[Callable[[Runtime], Awaitable[None]]] = []
        self.on_shutdown: list[Callable[[Runtime], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task] = []
        self._ready: asyncio.Event | None = None
        self._trigger = None
        # This process's MCP sessions (chat.mcp makes it on first use).
        self.mcp: McpHub | None = None

    # -- the event loop ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the loop-bound parts on the running loop (once per loop)."""
        loop = asyncio.get_running_loop()
        if self.loop is loop and self._ready is not None:
            await self._ready.wait()  # returns at once once started
            return
        # A new loop (the first request, or a test's own loop): start on it.
        self.loop = loop
        self._ready = asyncio.Event()
        try:
            self.outbox.start(loop)
            await self.inbox.open(loop, self)
            self._tasks = [loop.create_task(service(self)) for service in self.services]
            self._install_shutdown_trigger()
        finally:
            self._ready.set()

    async def stop(self) -> None:
        """Wind down: the apps' shutdown hooks, then the loop-bound tasks."""
        for hook in self.on_shutdown:
            try:
                await hook(self)
            except Exception:
                logger.exception("shutdown hook failed")
        tasks, self._tasks = self._tasks, []
        await _cancel(tasks)
        await self.inbox.close()
        await self.outbox.close()
        self.loop = None

    def _install_shutdown_trigger(self) -> None:
        """Under daphne: before the reactor stops (SIGTERM), wind down first."""
        try:
            from twisted.internet import defer, reactor
        except ImportError:
            return
        if self._trigger is not None or not getattr(reactor, "running", False):
            return

        def before_shutdown():
            return defer.Deferred.fromFuture(asyncio.ensure_future(self.stop()))

        self._trigger = reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)

    def call_soon(self, callback: Callable, *args) -> bool:
        """Run ``callback`` on the server loop from any thread; False if none runs."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return False
        loop.call_soon_threadsafe(callback, *args)
        return True

    async def off_loop(self, fn: Callable, *args, pool: Executor | None = None, **kwargs):
        """Run blocking ``fn`` on one of our pools (never the shared sync thread)."""

        def call():
            try:
                return fn(*args, **kwargs)
            finally:
                release_connection()

        return await sync_to_async(call, thread_sensitive=False, executor=pool or self.io_pool)()

    # -- runs hosted here ------------------------------------------------------------------

    def local_runs(self) -> dict[str, LocalRun]:
        with self.lock:
            return dict(self.runs)

    def working_runs(self) -> int:
        with self.lock:
            return sum(1 for run in self.runs.values() if not run.parked)


_RUNTIME: Runtime | None = None
_RUNTIME_LOCK = threading.Lock()


def runtime() -> Runtime:
    """This process's runtime, made on first use with the settings of that moment."""
    global _RUNTIME
    if _RUNTIME is None:
        with _RUNTIME_LOCK:
            if _RUNTIME is None:
                _RUNTIME = Runtime(agent_workers=settings.STUDIO_AGENT_WORKERS)
    return _RUNTIME


def replace_runtime(**sizes: int) -> Runtime:
    """A fresh runtime with the same plug-ins (tests: other pool sizes, a clean slate)."""
    global _RUNTIME
    old = runtime()
    new = Runtime(agent_workers=sizes.get("agent_workers", settings.STUDIO_AGENT_WORKERS))
    new.inbox.handlers = dict(old.inbox.handlers)
    new.inbox.poll = old.inbox.poll
    new.services = list(old.services)
    new.on_shutdown = list(old.on_shutdown)
    _RUNTIME = new
    return new


def restore_runtime(rt: Runtime) -> None:
    """Put back a runtime ``replace_runtime`` set aside (tests)."""
    global _RUNTIME
    _RUNTIME = rt
