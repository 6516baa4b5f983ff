"""Plain pushes whose reply may be lost: written with a mark, retried without a twin.

A connection that breaks after a push was sent leaves its outcome unknown:
the job may be in Redis (and may already have run) or not. Retrying blindly
could enqueue it twice; giving up could lose it. Each plain push therefore
sets, atomically with its writes, the connection's mark to the push's
number on that connection: a push of one job is one call of the
:data:`~wurk.wire.push_lua.PUSH_MARKED` script, a bulk slice one MULTI/EXEC
of native commands. A push that fails after sending leaves behind its
(mark, number): the evidence that tells, at the next attempt, whether it
landed. That attempt is the script, which checks it first.

Duties:
1. Number the pushes of each connection (:class:`_Marks`); a connection
   whose push failed gets a fresh mark, so no later push can stand in for
   the one that failed.
2. Write a push (``write``: a flow each client drives on its own pool)
   with the evidence of every earlier attempt of its jobs: where one landed,
   the write is a no-op. So the pool may replay it, and does.
3. Raise :class:`PushOutcomeUnknown` when every attempt failed and one may
   have landed, remembering the evidence by jid (:class:`_Remembered`), so a
   push of the same jid later in this process (``error.retry()``,
   ``Job.set(jid=error.jid)``, ``client.push({..., "jid": ...})``) is
   enqueued once, whether or not the first landed. A push that succeeds
   forgets its jids.
4. The same for replica-confirmed pushes (``write_confirmed``), whose
   PUSH_ONCE markers already make a resend under the same nonce a no-op:
   the nonce is what is remembered by jid.
"""

from __future__ import annotations

import collections
import functools
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from wurk.push.confirmed import ConfirmedPush, PushNotConfirmedError, QueuedJob
from wurk.push.exchange import Flow, Send, Talk, raise_first, scripted
from wurk.redis.policy import ErrorKind, PoolExhausted, classify
from wurk.wire import keys
from wurk.wire.payload import score
from wurk.wire.push_lua import PUSH_MARKED

# A push's landing evidence: (mark token, the push's number on that mark).
Mark = tuple[str, int]
V = TypeVar("V")
# Jids whose pushes' evidence is kept: past it, the oldest are forgotten.
MAX_REMEMBERED = 100_000


class PushOutcomeUnknown(RuntimeError):  # noqa: N818 - says what the caller learns, as OverLimit does
    """A push was sent to Redis but its reply never came: the jobs may or may not be in.

    ``jid`` (the first), ``jids`` and ``queue`` name what was pushed.
    Pushing again with the same jid in this process (:meth:`retry`,
    ``Job.set(jid=error.jid).perform_async(...)``, ``client.push({...,
    "jid": error.jid})``) enqueues each job once, whether or not the first
    push landed, while its mark lives (``keys.PUSH_MARK_TTL``); a new jid could double it.
    """

    def __init__(self, push: ConfirmedPush, cause: BaseException,
                 resend: Callable[[], object]) -> None:
        self.jids = push.jids
        self.jid = self.jids[0] if self.jids else ""
        queues = sorted({job.queue for job in push.jobs})
        self.queue = queues[0] if len(queues) == 1 else None
        self._resend = resend
        where = f"queue {self.queue!r}" if self.queue else f"queues {queues}"
        super().__init__(
            f"outcome unknown: {len(self.jids)} job(s) ({where}, first jid {self.jid}) were "
            f"sent to Redis but the reply was lost ({type(cause).__name__}: {cause}); they may "
            "or may not be enqueued. Push again with the same jid (error.retry(), or "
            "Job.set(jid=error.jid)) and each is enqueued once; a new jid could double it")

    def retry(self) -> Any:
        """Send the same push again; a no-op where the first landed.

        Raises this error anew while Redis stays out of reach. For a push
        made by :class:`wurk.AsyncClient` it returns an awaitable."""
        return self._resend()


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a write that raised ``exc`` may have landed: the connection broke
    after sending, or the process was interrupted mid-write."""
    if isinstance(exc, PushOutcomeUnknown) or not isinstance(exc, Exception):
        return True
    return not isinstance(exc, PoolExhausted) and classify(exc) is ErrorKind.IO


class _Marks:
    """Each connection's mark token and the count of pushes it wrote."""

    def __init__(self) -> None:
        self._by_conn: weakref.WeakKeyDictionary[object, list[Any]] = weakref.WeakKeyDictionary()

    def next(self, conn: object) -> Mark:
        entry = self._by_conn.get(conn)
        if entry is None:
            entry = self._by_conn[conn] = [secrets.token_hex(8), 0]
        entry[1] += 1
        return entry[0], entry[1]

    def forget(self, conn: object) -> None:
        """After a failed push: the connection's later pushes get a new mark."""
        self._by_conn.pop(conn, None)


class _Remembered(Generic[V]):
    """What is kept of pushes whose outcome is unknown, by jid (bounded, thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_jid: collections.OrderedDict[str, V] = collections.OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._by_jid)

    def find(self, jids: Iterable[str]) -> list[V | None]:
        with self._lock:
            return [self._by_jid.get(jid) for jid in jids]

    def note(self, jids: Iterable[str], value: V) -> None:
        with self._lock:
            for jid in jids:
                self._by_jid[jid] = value
                self._by_jid.move_to_end(jid)
            while len(self._by_jid) > MAX_REMEMBERED:
                self._by_jid.popitem(last=False)

    def settle(self, jids: Iterable[str]) -> None:
        if not self._by_jid:
            return  # the whole cost for a process that never lost a reply
        with self._lock:
            for jid in jids:
                self._by_jid.pop(jid, None)

    def after_fork_in_child(self) -> None:
        # What is kept stays true in a child; only the lock may be held by a
        # thread that did not come along.
        self._lock = threading.Lock()


_marks = _Marks()
# Plain pushes: the marks of every try. Replica-confirmed ones: their nonce.
_attempts: _Remembered[tuple[Mark, ...]] = _Remembered()
_nonces: _Remembered[str] = _Remembered()


def groups(push: ConfirmedPush) -> list[tuple[ConfirmedPush, tuple[Mark, ...]]]:
    """``push`` cut into parts whose jobs share the same evidence (one part when none)."""
    if not _attempts:
        return [(push, ())]
    parts: dict[tuple[Mark, ...], list[Any]] = {}
    for job, marks in zip(push.jobs, _attempts.find(push.jids), strict=True):
        parts.setdefault(marks or (), []).append(job)
    return [(ConfirmedPush(tuple(jobs), push.nonce), marks) for marks, jobs in parts.items()]


def _grouped(push: ConfirmedPush) -> tuple[dict[str, list[str]], list[Any]]:
    """The immediate jobs by queue (in push order), and the schedule's score and member pairs."""
    immediate: dict[str, list[str]] = {}
    scheduled: list[Any] = []
    for job in push.jobs:
        if job.run_at is None:
            immediate.setdefault(job.queue, []).append(job.raw)
        else:
            scheduled += (score(job.run_at), job.raw)
    return immediate, scheduled


def marked(push: ConfirmedPush, mark: Mark) -> list[tuple[Any, ...]]:
    """A first push: its writes and its mark, to be sent in one MULTI/EXEC.

    Native commands, as a push always sent: a script would copy each payload
    in and out of Lua, which halves the rate of bulk pushes."""
    immediate, scheduled = _grouped(push)
    commands: list[tuple[Any, ...]] = []
    if immediate:
        commands.append(("SADD", keys.QUEUES, *immediate))
        commands.extend(("LPUSH", keys.queue(q), *raws) for q, raws in immediate.items())
    if scheduled:
        commands.append(("ZADD", keys.SCHEDULE, *scheduled))
    commands.append(("SET", keys.push_mark(mark[0]), mark[1], "EX", keys.PUSH_MARK_TTL))
    return commands


def checked(push: ConfirmedPush, mark: Mark, earlier: Iterable[Mark]) -> tuple[Any, ...]:
    """The PUSH_MARKED call: a push of one job, or any push again after tries
    that may have landed (it writes nothing where ``earlier`` shows one did)."""
    earlier = list(earlier)
    if not earlier and len(push.jobs) == 1:
        return _one(push.jobs[0], mark)
    keys_ = [keys.QUEUES, keys.push_mark(mark[0]), *(keys.push_mark(t) for t, _ in earlier)]
    args: list[Any] = [mark[1], keys.PUSH_MARK_TTL, len(earlier), *(n for _, n in earlier)]
    immediate, scheduled = _grouped(push)
    for queue, raws in immediate.items():
        keys_.append(keys.queue(queue))
        args += (queue, len(raws), *raws)
    if scheduled:
        keys_.append(keys.SCHEDULE)
        args += ("", len(scheduled) // 2, *scheduled)
    return ("EVALSHA", PUSH_MARKED.sha, len(keys_), *keys_, *args)


def _one(job: QueuedJob, mark: Mark) -> tuple[Any, ...]:
    """:func:`checked` for the commonest push, one job and no earlier try, built directly."""
    if job.run_at is None:
        return ("EVALSHA", PUSH_MARKED.sha, 3, keys.QUEUES, keys.push_mark(mark[0]),
                keys.queue(job.queue), mark[1], keys.PUSH_MARK_TTL, 0, job.queue, 1, job.raw)
    return ("EVALSHA", PUSH_MARKED.sha, 3, keys.QUEUES, keys.push_mark(mark[0]), keys.SCHEDULE,
            mark[1], keys.PUSH_MARK_TTL, 0, "", 1, score(job.run_at), job.raw)


class _Attempt:
    """One write of one part, a trip the pool may replay: the evidence it
    started with and what its tries added."""

    idempotent = True  # safe to replay: each try carries the evidence of those before it

    def __init__(self, push: ConfirmedPush, earlier: tuple[Mark, ...],
                 attempts: int | None) -> None:
        self.push = push
        self.marks = list(earlier)
        self.attempts = attempts
        # Whether some try (or an earlier push of these jobs) may have landed.
        self.unknown = bool(earlier)

    def commands(self, conn: object) -> tuple[bool, list[tuple[Any, ...]]]:
        """This try's commands, and whether they are the checked script (else a MULTI's)."""
        mark = _marks.next(conn)
        # Every try's mark is evidence for the next: one whose push never
        # ran stays below its number, so it only costs a key to read.
        earlier, self.marks = self.marks, [*self.marks, mark]
        if earlier or len(self.push.jobs) == 1:
            # One command and one reply: cheaper for one job than a MULTI's five.
            return True, [checked(self.push, mark, earlier)]
        return False, marked(self.push, mark)

    def talk(self, conn: object) -> Talk[None]:
        script, commands = self.commands(conn)
        try:
            if script:
                raise_first((yield from scripted(Send(commands), (PUSH_MARKED,))))
            else:
                raise_first((yield Send(commands, transaction=True)))
        except BaseException as exc:
            self.failed(conn, exc)
            raise

    def failed(self, conn: object, exc: BaseException) -> None:
        _marks.forget(conn)
        self.unknown = self.unknown or outcome_unknown(exc)

    def gave_up(self, exc: BaseException) -> bool:
        """After the pool gave up: whether the push may have landed (then remembered)."""
        self.unknown = self.unknown or outcome_unknown(exc)
        if self.unknown:
            _attempts.note(self.push.jids, tuple(self.marks))
        return self.unknown

    def landed(self) -> None:
        _attempts.settle(self.push.jids)


Resend = Callable[[ConfirmedPush], object]


def write(push: ConfirmedPush, resend: Resend, *, attempts: int | None = None) -> Flow[None]:
    """Write ``push`` plainly; :class:`PushOutcomeUnknown` when it may have landed,
    whose ``retry()`` is ``resend(push)``."""
    for part, earlier in groups(push):
        attempt = _Attempt(part, earlier, attempts)
        try:
            yield attempt
        except BaseException as exc:
            # An interrupt (KeyboardInterrupt, a cancelled task) goes on as itself:
            # its evidence is kept all the same.
            if attempt.gave_up(exc) and isinstance(exc, Exception):
                raise PushOutcomeUnknown(part, exc, functools.partial(resend, part)) from exc
            raise
        attempt.landed()


def with_earlier_nonce(push: ConfirmedPush) -> tuple[ConfirmedPush, bool]:
    """``push`` under the nonce of an earlier push of its jobs whose outcome is
    unknown (when they all share one), and whether it had one."""
    if not _nonces:
        return push, False
    found = set(_nonces.find(push.jids))
    if len(found) != 1 or None in found:
        return push, False
    return ConfirmedPush(push.jobs, found.pop() or push.nonce), True


def write_confirmed(push: ConfirmedPush, send: Callable[[ConfirmedPush], Flow[Any]],
                    resend: Resend) -> Flow[None]:
    """A replica-confirmed write (``send``), under the nonce of any earlier
    attempt; :class:`PushOutcomeUnknown` when it may have landed, whose
    ``retry()`` is ``resend(push)``."""
    push, earlier = with_earlier_nonce(push)
    try:
        yield from send(push)
    except Exception as exc:
        raise _confirm_failed(push, exc, earlier, lambda: resend(push)) from exc
    _nonces.settle(push.jids)


def _confirm_failed(push: ConfirmedPush, exc: Exception, earlier: bool,
                    resend: Callable[[], object]) -> PushOutcomeUnknown:
    """The error for a failed confirmed push whose outcome is unknown (else ``exc``
    raised again); its nonce is remembered where it may have landed."""
    unconfirmed = isinstance(exc, PushNotConfirmedError)  # on the primary: a resend is one
    if unconfirmed or earlier or outcome_unknown(exc):
        _nonces.note(push.jids, push.nonce)
    if unconfirmed or not (earlier or outcome_unknown(exc)):
        raise exc
    return PushOutcomeUnknown(push, exc, resend)


def forget_after_fork() -> None:
    """In a forked child: fresh locks for what is kept of unknown pushes."""
    _attempts.after_fork_in_child()
    _nonces.after_fork_in_child()
