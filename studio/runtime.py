"""Process-wide state in one typed object, made once when the process starts.

``runtime()`` returns the process's ``Runtime``: the worker pools, the
channel-layer outbox and inbox, the process's lifecycle, and the parts apps
keep per process (``part``: chat's table of runs stepped here, its MCP
sessions), which the runtime holds by name and never looks into. Its asyncio parts
start on the server's event loop the first time a request or socket arrives
(``await runtime().start()``); nothing here is created at import time or
sized from settings read at import.

Apps plug their behaviour in at start-up (``AppConfig.ready``): approvals
its webhook; chat the inbox's ``run.cancel`` handler, the heartbeat, the
sweep that resumes runs, and what happens as the process exits. So this
module imports nothing of either app, for type hints neither.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import queue
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from typing import TypeVar

from asgiref.sync import sync_to_async
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)
T = TypeVar("T")


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

    A PostgreSQL connection goes back to its pool (a waiting run must hold
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


# What a threaded outbox still has queued at exit is sent for at most this long.
FLUSH_AT_EXIT_SECONDS = 5.0


class Outbox:
    """Channel-layer sends from any thread, in order, without blocking the sender.

    Delivery is at most once (the row is the truth): a send that fails is
    logged and dropped. With no server loop running (a management command, a
    plain test, a process winding down) a send is made synchronously instead,
    unless the process asked for a thread of the outbox's own (``threaded``).
    """

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._threaded = False
        self._thread_pid = 0  # the process whose thread serves ``loop`` (0: none)
        self._thread_lock = threading.Lock()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue = asyncio.Queue()
        self._task = loop.create_task(self._drain(self._queue))

    async def close(self) -> None:
        if self._task is not None:
            await _cancel([self._task])
        self.loop = self._queue = self._task = None

    def threaded(self) -> None:
        """Send from a loop on a thread of the outbox's own, started on first use.

        For a process with no server loop whose requests run on threads (a
        WSGI worker): a synchronous send there makes a new loop, and with it
        new Redis connections, on every call, in the request's own time. A
        forked child starts a thread of its own; at exit, what was queued is
        sent first (for a bounded time).
        """
        self._threaded = True

    def _own_loop(self) -> None:
        """Start (once per process) the thread whose loop serves the queue."""
        with self._thread_lock:
            if self._thread_pid == os.getpid():
                return
            # A forked child inherits the parent's loop but not its thread.
            self.loop = self._queue = self._task = None
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                self.start(loop)
                loop.call_soon(started.set)  # once it runs: sends queue from then on
                loop.run_forever()

            threading.Thread(target=serve, name="studio-outbox", daemon=True).start()
            started.wait(10)
            if self._thread_pid == 0:
                atexit.register(self._flush_at_exit)
            self._thread_pid = os.getpid()

    def _flush_at_exit(self) -> None:
        if self._thread_pid != os.getpid() or self.loop is None or self._queue is None:
            return
        done: Future = Future()
        with contextlib.suppress(RuntimeError):  # its loop already closed
            self.loop.call_soon_threadsafe(self._queue.put_nowait, ("mark", "", {}, done))
            with contextlib.suppress(Exception):
                done.result(timeout=FLUSH_AT_EXIT_SECONDS)

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

    def channel(self, channel: str, message: dict) -> None:
        if channel:
            self._put(("channel", channel, message, None))

    def _put(self, item: tuple) -> None:
        running = _running_loop()
        if self._threaded and running is None and self._thread_pid != os.getpid():
            self._own_loop()
        loop, q = self.loop, self._queue
        if loop is None or q is None or loop.is_closed() or not loop.is_running():
            if running is None:
                self._deliver_now(item)
            else:
                # Some other loop runs in this thread (a test driving a
                # browser): deliver from a thread of its own.
                thread = threading.Thread(target=self._deliver_now, args=(item,), daemon=True)
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

    def _deliver_now(self, item: tuple) -> None:
        """Deliver on a loop of this thread's own. Not ``async_to_sync``: it needs
        an executor, and a process winding down (atexit) can start none."""
        try:
            asyncio.run(self._deliver(item))
        except Exception:
            logger.warning("%s send to %s failed", item[0], item[1], exc_info=True)

    async def _drain(self, q: asyncio.Queue) -> None:
        while True:
            item = await q.get()
            try:
                if item[0] != "mark":  # a mark only says that all before it went
                    await self._deliver(item)
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


def shared_channel() -> str:
    """A channel every serving process of this deployment listens on: work any
    one of them may take (a run to resume, handed over by a process that serves
    no socket). A layer prefixes groups and its own channels, not this name."""
    return f"{settings.STUDIO_CHANNEL_PREFIX}.shared"


class Inbox:
    """This process's own channel and the shared one, and the tasks that serve them.

    A run's row names the inbox of the process stepping it; a Stop pressed
    in another process is sent here. With Redis, a watcher notices a Redis
    restart so sockets can re-join their groups.
    """

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, Callable[[dict], None]] = {}
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

    async def open(self, loop: asyncio.AbstractEventLoop) -> None:
        layer = get_channel_layer()
        # Default prefix on purpose: a layer may treat a process's "specific."
        # channels as one (channels-redis's core layer receives them through
        # one list under one lock, which another prefix would hold alone).
        self.name = await layer.new_channel()
        self._tasks = [
            loop.create_task(self._listen(layer, self.name)),
            loop.create_task(self._listen(layer, shared_channel())),
        ]
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


class Runtime:
    """Everything this process keeps between requests (see the module docstring)."""

    def __init__(self, *, agent_workers: int) -> None:
        # Runs that are *working*; a waiting run holds nothing in any process.
        self.agent_pool = DaemonPool(agent_workers, "studio-agent")
        # Short database work off the loop (sockets, the sweep, the heartbeat):
        # never queued behind a full agent pool.
        self.io_pool = DaemonPool(4, "studio-io")
        self.outbox = Outbox()
        self.inbox = Inbox()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        # What the apps keep per process, by name (``part``).
        self._parts: dict[str, object] = {}
        # The process is exiting: it takes no new work.
        self.stopping = False
        # Loop-bound services the apps add (chat's heartbeat and sweep), and
        # what they do as the process exits (chat lets working runs finish).
        self.services: list[Callable[[Runtime], Awaitable[None]]] = []
        self.on_exit: list[Callable[[Runtime], None]] = []
        self._tasks: list[asyncio.Task] = []
        self._ready: asyncio.Event | None = None
        self._exit_registered = False

    # -- the event loop ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the loop-bound parts on the running loop (once per loop)."""
        loop = asyncio.get_running_loop()
        if self.loop is loop and self._ready is not None:
            await self._ready.wait()  # returns at once once started
            return
        # A new loop (the first request, or a test's own loop): start on it.
        self.loop = loop
        self.stopping = False
        self._ready = asyncio.Event()
        try:
            self.outbox.start(loop)
            await self.inbox.open(loop)
            self._tasks = [loop.create_task(service(self)) for service in self.services]
            if not self._exit_registered:
                # daphne returns from its reactor on SIGTERM and the
                # interpreter exits: the apps wind down then, on this thread.
                atexit.register(self.exit)
                self._exit_registered = True
        finally:
            self._ready.set()

    async def stop(self) -> None:
        """Stop the loop-bound tasks (tests; a server process ends with ``exit``)."""
        tasks, self._tasks = self._tasks, []
        await _cancel(tasks)
        await self.inbox.close()
        await self.outbox.close()
        self.loop = None

    def exit(self) -> None:
        """The process is exiting: take no new work, and let the apps wind down (once)."""
        if self.stopping:
            return
        self.stopping = True
        for hook in self.on_exit:
            try:
                hook(self)
            except Exception:
                logger.exception("exit hook failed")

    @property
    def serving(self) -> bool:
        """True while this process takes new work: a server loop runs, and it is not exiting."""
        loop = self.loop
        return not self.stopping and loop is not None and loop.is_running()

    async def off_loop(self, fn: Callable, *args, pool: Executor | None = None, **kwargs):
        """Run blocking ``fn`` on one of our pools (never the shared sync thread)."""

        def call():
            try:
                return fn(*args, **kwargs)
            finally:
                release_connection()

        return await sync_to_async(call, thread_sensitive=False, executor=pool or self.io_pool)()

    # -- what the apps keep --------------------------------------------------------------

    def part(self, name: str, make: Callable[[], T]) -> T:
        """The app's part called ``name`` in this process, made by ``make`` on first
        use. Its module owns it; a fresh runtime (a test's) starts without it."""
        with self.lock:
            if name not in self._parts:
                self._parts[name] = make()
            return self._parts[name]  # type: ignore[return-value]

    def part_made(self, name: str) -> object | None:
        """The part if it was made (what exits or closes it asks), else None."""
        with self.lock:
            return self._parts.get(name)

    def part_drop(self, name: str) -> object | None:
        """Forget the part (tests: a clean one next time); returns what it was."""
        with self.lock:
            return self._parts.pop(name, None)


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
    new.services = list(old.services)
    new.on_exit = list(old.on_exit)
    _RUNTIME = new
    return new


def restore_runtime(rt: Runtime) -> None:
    """Put back a runtime ``replace_runtime`` set aside (tests)."""
    global _RUNTIME
    _RUNTIME = rt
