"""Leader election: at most one holder of a named lease across the cluster.

Duties:
1. ``Leader(name, ttl=...).start()`` campaigns on a supervised thread
   (a :class:`wurk.core.service.Service`): it takes the lease ``wurk:leader:<name>`` when
   it is free and, while it holds it, renews it every ``ttl / 3``. A follower
   tries again every ``ttl / 3``, or as soon as the holder's lease runs out
   if that comes first.
2. ``is_leader()`` is True only while a tenure is held and the last round
   trip that confirmed it was *sent* less than ``ttl * (1 - MARGIN)`` ago on
   this host's clock (CLOCK_BOOTTIME where there is one, so a suspended host
   counts the time it slept). The lease in Redis outlives that belief, so a
   paused or cut-off process stops believing it leads before anyone else can
   be elected.
3. Each tenure has a fencing token, larger than every earlier one of its
   name (see :data:`wurk.wire.lease.LEASE_ACQUIRE` for why it stays so when
   Redis loses the counter). ``fence()`` gives the (key, value) pair other
   Lua scripts compare before they write, so an ex-leader's late writes are
   refused inside Redis.
4. Redis trouble (an outage, a restart, maxmemory, a dropped connection, a
   garbage reply) never ends or spins the thread: each failed round trip is
   followed by a growing pause; a tenure that could not be renewed in time
   ends (``on_lost``), and the next success starts a new one.
5. ``stop()`` ends the thread and deletes the lease if it is still ours, so
   a follower takes over at its next try instead of waiting out the TTL.
   Every running Leader is stopped so at interpreter exit (``atexit``).
6. After a fork the child holds nothing: each Leader there is stopped and
   not leading (:func:`forget_after_fork`). This module registers that hook
   itself when first imported, after :mod:`wurk.runtime.forking`'s (which
   ``import wurk`` registers first), so it runs once threads and pools are
   reset; ``import wurk`` alone never loads this module.
"""

from __future__ import annotations

import atexit
import os
import random
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from wurk.core.logging import get_logger
from wurk.core.service import Service
from wurk.core.threads import describe
from wurk.redis.pool import RedisPool, RetrySettings
from wurk.redis.runtime import runtime_for
from wurk.redis.sentinel import SentinelSettings
from wurk.runtime.heartbeat import make_identity
from wurk.runtime.leader_policy import (
    MARGIN,
    RENEW_EVERY,
    Callback,
    check_callback,
    check_identity,
    check_leader_name,
    check_ttl,
    default_clock,
    error_pause,
    follower_pause,
)
from wurk.settings.config import default_config
from wurk.wire import keys
from wurk.wire.lease import (
    LEASE_ACQUIRE,
    LEASE_RELEASE,
    LEASE_RENEW,
    Acquired,
    Holder,
    parse_acquired,
    parse_holder,
)

if TYPE_CHECKING:
    from wurk.redis.connection import Conn
    from wurk.settings.config import Config

log = get_logger("wurk.leader")
JOIN_TIMEOUT = 5.0
WAIT_POLL = 0.05


@dataclass(frozen=True)
class _Tenure:
    value: str
    token: int
    # The clock reading taken before the round trip that last confirmed it.
    confirmed: float
    pid: int


_live: weakref.WeakSet[Leader] = weakref.WeakSet()


class Leader:
    """A campaign for the lease of one name; see the module docstring."""

    def __init__(self, name: str = "default", *, ttl: float = 15.0,
                 config: Config | None = None, identity: str | None = None,
                 on_elected: Callback | None = None, on_lost: Callback | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.name = check_leader_name(name)
        self.ttl = check_ttl(ttl)
        self._own_identity = identity is None
        self.identity = make_identity() if identity is None else check_identity(identity)
        self.on_elected = check_callback(on_elected, "on_elected")
        self.on_lost = check_callback(on_lost, "on_lost")
        self.config = config if config is not None else default_config()
        self.lease_key = keys.leader_lease(self.name)
        self.token_key = keys.leader_token(self.name)
        self._clock = clock or default_clock
        self._ttl_ms = int(self.ttl * 1000)
        self._valid_for = self.ttl * (1 - MARGIN)
        self._rng = random.Random()
        self._pool: RedisPool | None = None
        self._fresh_state()
        _live.add(self)

    def _fresh_state(self) -> None:
        self._lock = threading.Lock()
        self._elected = threading.Event()
        # The campaign's thread; a new one each start, None before the first.
        self.service: Service | None = None
        self._tenure: _Tenure | None = None
        # The value of a tenure of ours that ended without a release.
        self._ended: str | None = None
        # The value of the last tenure whose end was logged and told to on_lost.
        self._announced: str | None = None
        self._holder = self._new_holder()

    def _new_holder(self) -> str:
        return f"{self.identity}/{secrets.token_hex(4)}"

    def __repr__(self) -> str:
        return f"<Leader {self.name!r} identity={self.identity!r} token={self.token}>"

    # -- the public surface -----------------------------------------------
    def start(self) -> Leader:
        """Start campaigning (idempotent); returns self."""
        service = self.service
        if service is not None and service.stopping:
            service.stop(JOIN_TIMEOUT)  # a stop still finishing
        with self._lock:
            service = self.service
            if service is not None and service.alive():
                if not service.stopping:
                    return self
                raise RuntimeError(f"leader {self.name!r} is still stopping; start it later")
            if self._pool is None:
                self._pool = self._make_pool()
            self.service = Service(f"leader:{self.name}", self._step, failed=self._failed,
                                   finish=self._finish, name=f"wurk-leader-{self.name}")
            self.service.start()
        return self

    def stop(self) -> None:
        """Stop campaigning; delete the lease if it is still ours."""
        service = self.service
        if service is None:
            return
        if service.thread is threading.current_thread():
            service.stop()  # from a callback: the loop ends after this round
            return
        if not service.stop(JOIN_TIMEOUT):
            # Stuck in a round trip: release from here (on_lost runs on this
            # thread then). The thread, once back, sees the stop and believes
            # in no tenure again (_believe).
            log.warning("leader.stop_timeout", name=self.name)
            with self._lock:
                tenure, self._tenure = self._tenure, None
            if tenure is not None:
                self._release(tenure)
                self._end(tenure, "stopped")
            return
        if self._pool is not None:
            self._pool.close()  # idle sockets; a later start() dials again

    def __enter__(self) -> Leader:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def is_leader(self) -> bool:
        tenure = self._tenure
        return tenure is not None and self._believed(tenure)

    @property
    def token(self) -> int | None:
        """The fencing token of the current tenure, or None when not leading."""
        tenure = self._tenure
        return tenure.token if tenure is not None and self._believed(tenure) else None

    def fence(self) -> tuple[str, str] | None:
        """(lease key, lease value) while leading: a write is fenced by a Lua
        script that first checks ``redis.call('GET', key) == value``."""
        tenure = self._tenure
        if tenure is None or not self._believed(tenure):
            return None
        return self.lease_key, tenure.value

    def wait_until_leader(self, timeout: float | None = None) -> bool:
        """Block until this process leads (True) or ``timeout`` seconds pass (False)."""
        if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
            raise ValueError(f"timeout must be None or a number >= 0, not {timeout!r}")
        if self._stopped():
            raise RuntimeError(f"leader {self.name!r} is not running: start() it first")
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_leader():
            left = WAIT_POLL if deadline is None else min(WAIT_POLL, deadline - time.monotonic())
            if left <= 0 or self._stopped():
                return False
            if self._elected.is_set():
                time.sleep(left)  # elected, but the belief lapsed: the thread will notice
            else:
                self._elected.wait(left)
        return True

    # -- the campaign -------------------------------------------------------
    def _stopped(self) -> bool:
        """Not campaigning: never started, or asked to stop."""
        service = self.service
        return service is None or service.stopping

    def _step(self) -> float:
        """One round trip; returns the pause before the next. Redis trouble raises
        to the service, which calls :meth:`_failed` and campaigns on."""
        tenure = self._tenure
        if tenure is not None and self._believed(tenure):
            return self._renew(tenure)
        if tenure is not None:
            self._end(tenure, "lapsed")
        return self._acquire()

    def _renew(self, tenure: _Tenure) -> float:
        sent = self._clock()
        kept = self._run(lambda c: LEASE_RENEW.run(c, [self.lease_key],
                                                   [tenure.value, self._ttl_ms]))
        if kept != 1:
            self._end(tenure, "taken")
            return 0.0
        self._believe(replace(tenure, confirmed=sent))
        return max(0.0, sent + self.ttl * RENEW_EVERY - self._clock())

    def _acquire(self) -> float:
        sent = self._clock()
        reply = self._run(lambda c: LEASE_ACQUIRE.run(
            c, [self.lease_key, self.token_key], [self._holder, self._ttl_ms, self._ended or ""]))
        result = parse_acquired(reply, self._holder)
        self._ended = None  # the script dropped it if it was still there
        if not isinstance(result, Acquired):
            return follower_pause(result, self.ttl, self._rng)
        tenure = _Tenure(result.value, result.token, sent, os.getpid())
        if not self._believe(tenure):
            self._release(tenure)  # stopped meanwhile
            return 0.0
        self._elected.set()
        log.info("leader.elected", name=self.name, identity=self.identity, token=result.token)
        self._call(self.on_elected, "on_elected")
        return max(0.0, sent + self.ttl * RENEW_EVERY - self._clock())

    def _believe(self, tenure: _Tenure) -> bool:
        """Make ``tenure`` the current one, unless a stop came first."""
        with self._lock:
            if self._stopped():
                return False
            self._tenure = tenure
            return True

    def _end(self, tenure: _Tenure, reason: str) -> None:
        """A tenure is over (``lapsed``, ``taken`` or ``stopped``): told once."""
        with self._lock:
            self._tenure = None
            if self._announced == tenure.value:
                return
            self._announced = tenure.value
        self._elected.clear()
        self._holder = self._new_holder()
        if reason == "lapsed":
            self._ended = tenure.value
        (log.info if reason == "stopped" else log.warning)(
            "leader.lost", name=self.name, identity=self.identity, token=tenure.token,
            reason=reason)
        self._call(self.on_lost, "on_lost")

    def _failed(self, exc: BaseException, failures: int) -> float:
        if failures & (failures - 1) == 0:  # the 1st, 2nd, 4th, 8th... in a row
            log.warning("leader.error", name=self.name, failures=failures, error=describe(exc))
        tenure = self._tenure
        if tenure is not None and not self._believed(tenure):
            self._end(tenure, "lapsed")
        return error_pause(failures, self.ttl, self._rng)

    def _finish(self) -> None:
        tenure = self._tenure
        if tenure is not None:
            # Stop believing before the release: once the lease is gone,
            # another process may lead.
            self._tenure = None
            self._release(tenure)
            self._end(tenure, "stopped")

    def _release(self, tenure: _Tenure) -> None:
        try:
            self._run(lambda c: LEASE_RELEASE.run(c, [self.lease_key], [tenure.value]))
        except BaseException as exc:  # noqa: BLE001 - the lease expires on its own
            log.warning("leader.release_failed", name=self.name, error=describe(exc))

    def _call(self, callback: Callback | None, what: str) -> None:
        if callback is None:
            return
        try:
            callback()
        except BaseException as exc:  # noqa: BLE001 - a callback must not end the campaign
            log.error("leader.callback_failed", name=self.name, callback=what,
                      error=describe(exc))

    def _believed(self, tenure: _Tenure) -> bool:
        return tenure.pid == os.getpid() and self._clock() - tenure.confirmed < self._valid_for

    def _run(self, block: Callable[[Conn], Any]) -> Any:
        assert self._pool is not None
        # One attempt: the loop paces its own retries, and a replay inside the
        # pool would only delay noticing that the lease may be gone.
        return self._pool.run(block, idempotent=True, attempts=1)

    def _make_pool(self) -> RedisPool:
        """The campaign's own connections, so a busy process pool never delays
        a renewal, with timeouts no longer than a renewal period."""
        cfg = self.config
        bound = self.ttl * RENEW_EVERY
        return RedisPool(cfg.redis_url, size=2,
                         connect_timeout=min(cfg.redis_connect_timeout, bound),
                         read_timeout=min(cfg.redis_read_timeout, bound),
                         retry=RetrySettings(1, cfg.redis_retry_base, cfg.redis_retry_cap),
                         on_error=cfg.on_redis_error, sentinel=SentinelSettings.from_config(cfg))

    def _forget_in_child(self) -> None:
        if self._own_identity:
            self.identity = make_identity()
        self._fresh_state()


def current_holder(name: str = "default", config: Config | None = None) -> Holder | None:
    """Who holds the lease of ``name`` now (its token and identity), or None;
    one GET, from any process, campaigning or not."""
    key = keys.leader_lease(check_leader_name(name))
    raw = runtime_for(config or default_config()).pool.call("GET", key, idempotent=True)
    return parse_holder(raw)


def leader(name: str = "default", **kw: Any) -> Leader:
    """Build a :class:`Leader` and start it."""
    return Leader(name, **kw).start()


def stop_all() -> None:
    """At interpreter exit: release held leases, so followers take over at once."""
    for each in list(_live):
        each.stop()


def forget_after_fork() -> None:
    """In a forked child: no Leader leads or campaigns; ``start()`` begins anew."""
    for each in list(_live):
        each._forget_in_child()


os.register_at_fork(after_in_child=forget_after_fork)
atexit.register(stop_all)
