"""A push's talk with Redis as data, and the two drivers that carry it out.

The push pipeline decides; it never sends. Each decision that needs Redis
is written once, as a generator shared by :class:`wurk.Client` and
:class:`wurk.AsyncClient`, and each client drives it with its own I/O:

- a *talk* (:data:`Talk`) is one connection's side of one try: it yields
  :class:`Send` (commands sent in one write, their replies read back in
  place, error replies included) and gets the replies back; what the
  connection raised is thrown into it;
- a *trip* (:class:`Trip`) is one ``pool.run`` block: how to start a talk
  on the connection the pool gives it, and whether the pool may replay it;
- a *flow* (:data:`Flow`) is a push's trips in order: it yields each trip
  and gets its result, or has the trip's error thrown into it.

Duties:
1. :class:`Commands`: the trip of fixed commands, each script among them
   loaded on NOSCRIPT (which ran nothing) and only those sent again.
2. :class:`Ask`: a built-in step's question, the trip and how its result
   decides each payload.
3. ``drive``/``adrive`` (``run``/``arun`` for one trip): run a flow on the
   sync or the asyncio pool, each trip through the pool's apply-safety
   (``pool.run``); ``converse``/``aconverse`` run a talk on one connection.
   They are the only code here that waits.
4. A MULTI/EXEC is asked for as such (``Send.transaction``): the sync
   connection sends it natively, the asyncio one wraps it, and both give
   the talk the EXEC's replies.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import redis.exceptions as rx

if TYPE_CHECKING:
    from wurk.redis.apool import AsyncConn, AsyncRedisPool
    from wurk.redis.connection import Conn
    from wurk.redis.pool import RedisPool
    from wurk.wire.lua import Script

T = TypeVar("T")
Command = tuple[Any, ...]


class Send(NamedTuple):
    """Commands for one write: their replies come back in order, errors in place.
    (A named tuple: one is made for every push.)"""

    commands: Sequence[Command]
    transaction: bool = False  # wrapped in MULTI/EXEC; the EXEC's replies come back
    timeout: float | None = None  # the read timeout for each reply (a WAIT inside)


Talk = Generator[Send, list[Any], T]


class Trip(Protocol):
    """One block the pool runs, and may run again where that is safe."""

    @property
    def idempotent(self) -> bool: ...
    @property
    def attempts(self) -> int | None: ...
    def talk(self, conn: object) -> Talk[Any]: ...


class Aside:
    """A request of a flow that is no trip: the flow's driver answers it itself
    (a push handed to the client's buffer, :class:`wurk.push.writer.Hand`)."""


Flow = Generator["Trip | Aside", Any, T]
Answer = Callable[[Aside], Any]


def raise_first(replies: Sequence[Any]) -> list[Any]:
    """``replies`` as they are, unless one is an error reply: that is raised."""
    for reply in replies:
        if isinstance(reply, rx.ResponseError):
            raise reply
    return list(replies)


def scripted(send: Send, scripts: Sequence[Script]) -> Talk[list[Any]]:
    """Send ``send``; the commands a NOSCRIPT refused (they ran nothing) go
    again after their scripts are loaded, in one more round trip. The replies,
    errors in place."""
    replies = yield send
    again = [i for i, reply in enumerate(replies) if isinstance(reply, rx.NoScriptError)]
    if not again:
        return replies
    loads = [("SCRIPT", "LOAD", script.source) for script in scripts]
    retried = yield Send([*loads, *(send.commands[i] for i in again)], timeout=send.timeout)
    raise_first(retried[:len(loads)])
    for i, reply in zip(again, retried[len(loads):], strict=True):
        replies[i] = reply
    return replies


@dataclass(frozen=True)
class Commands:
    """A trip of fixed commands, sent in one round trip; its result is their
    replies. Each NOSCRIPT'd one is sent again once loaded; any other error
    reply is raised."""

    commands: tuple[Command, ...]
    idempotent: bool = True
    scripts: tuple[Script, ...] = ()
    attempts: int | None = None
    # What an error reply is raised as (a script's refusal as the caller's
    # error); raised inside the block, so the pool still sees a failover's.
    refuse: Callable[[rx.ResponseError], Exception] | None = None

    def talk(self, conn: object) -> Talk[list[Any]]:
        replies = yield from scripted(Send(self.commands), self.scripts)
        for reply in replies:
            if isinstance(reply, rx.ResponseError):
                raise reply if self.refuse is None else self.refuse(reply)
        return replies


@dataclass(frozen=True)
class Ask:
    """A built-in step's question for a batch of payloads: the trip, and how
    its result decides each payload (True: written)."""

    trip: Trip
    decide: Callable[[Any], list[bool]]


def once(trip: Trip) -> Flow[Any]:
    """The flow of one trip: its result."""
    return (yield trip)


# -- the sync driver -----------------------------------------------------------
def run(pool: RedisPool, trip: Trip) -> Any:
    """One trip on the sync pool."""
    return pool.run(_block(trip), idempotent=trip.idempotent, attempts=trip.attempts)


def drive(pool: RedisPool, flow: Flow[T], aside: Answer | None = None) -> T:
    """Run ``flow`` on the sync pool: each trip one ``pool.run``, each aside
    answered by ``aside``."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            trip = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            reply = _answer(aside, trip) if isinstance(trip, Aside) else run(pool, trip)
        except BaseException as exc:  # noqa: BLE001 - the flow decides what it means
            error = exc


def _answer(aside: Answer | None, request: Aside) -> Any:
    if aside is None:
        raise TypeError(f"this flow asks {type(request).__name__}, which nothing here answers")
    return aside(request)


def _block(trip: Trip) -> Callable[[Conn], Any]:
    return lambda conn: converse(conn, trip.talk(conn))


def converse(conn: Conn, talk: Talk[T]) -> T:
    """Run one try's talk on ``conn``."""
    replies: list[Any] | None = None
    error: BaseException | None = None
    while True:
        try:
            send = talk.send(replies) if error is None else talk.throw(error)  # type: ignore[arg-type]
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        replies, error = None, None
        try:
            replies = _sent(conn, send)
        except BaseException as exc:  # noqa: BLE001 - the talk decides what it means
            error = exc


def _sent(conn: Conn, send: Send) -> list[Any]:
    if len(send.commands) == 1 and not send.transaction:
        # One command: the plain call, cheaper than a pipeline of one.
        try:
            return [conn.call(*send.commands[0], timeout=send.timeout)]
        except rx.ResponseError as exc:
            return [exc]
    return conn.pipeline(send.commands, transaction=send.transaction, raise_on_error=False,
                         timeout=send.timeout)


# -- the asyncio driver --------------------------------------------------------
async def arun(pool: AsyncRedisPool, trip: Trip) -> Any:
    """One trip on the asyncio pool."""
    return await pool.run(lambda conn: aconverse(conn, trip.talk(conn)),
                          idempotent=trip.idempotent, attempts=trip.attempts)


async def adrive(pool: AsyncRedisPool, flow: Flow[T], aside: Answer | None = None) -> T:
    """:func:`drive` on the asyncio pool; ``aside`` returns an awaitable."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            trip = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            reply = (await _answer(aside, trip) if isinstance(trip, Aside)
                     else await arun(pool, trip))
        except BaseException as exc:  # noqa: BLE001 - the flow decides what it means
            error = exc


async def aconverse(conn: AsyncConn, talk: Talk[T]) -> T:
    """:func:`converse` on an asyncio connection."""
    replies: list[Any] | None = None
    error: BaseException | None = None
    while True:
        try:
            send = talk.send(replies) if error is None else talk.throw(error)  # type: ignore[arg-type]
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        replies, error = None, None
        try:
            replies = await _asent(conn, send)
        except BaseException as exc:  # noqa: BLE001 - the talk decides what it means
            error = exc


async def _asent(conn: AsyncConn, send: Send) -> list[Any]:
    if not send.transaction:
        return await conn.pipeline(send.commands, raise_on_error=False, timeout=send.timeout)
    replies = await conn.pipeline([("MULTI",), *send.commands, ("EXEC",)],
                                  raise_on_error=False, timeout=send.timeout)
    return executed(replies)


def executed(replies: list[Any]) -> list[Any]:
    """The EXEC's replies of a MULTI sent as plain commands; refused whole, its reason raised."""
    result = replies[-1]
    if not isinstance(result, list):
        # Refused whole: a queued command's error (READONLY on a replica) says why.
        queued = [r for r in replies[1:-1] if isinstance(r, rx.ResponseError)]
        raise queued[0] if queued else rx.ResponseError(f"EXEC did not run: {result!r}")
    return result
