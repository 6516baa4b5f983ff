"""What a forked child drops of its parent's, in one function, in one order.

A child of ``os.fork`` (a swarm child, a gunicorn worker of an app that
pushes jobs) inherits the parent's sockets, locks held by threads that did
not come along, and buffers of pushes the parent still owns. Each module
that holds such state offers a ``forget_after_fork``; this module calls them
all, once, right after every fork (``os.register_at_fork``), in this order:

1. Threads (:mod:`wurk.core.threads`): the supervisor forgets the parent's
   threads, so nothing waits on or reports a thread that is not here.
2. Redis (:mod:`wurk.redis.runtime`): every pool closes our copies of the
   parent's sockets without shutting the parent's connections down (the next
   use dials), and every runtime drops its asyncio pools.
3. Pushes (:mod:`wurk.push.buffered`, :mod:`wurk.push.confirmed`,
   :mod:`wurk.push.landing`): the parent's buffered pushes and confirmation
   markers are the parent's to send; the child starts empty, on the fresh
   pools of step 2 (keeping, under a fresh lock, the evidence of pushes
   whose outcome is unknown).
4. The spool (:mod:`wurk.push.spool`, :mod:`wurk.push.spool_drain`): close
   inherited claim locks so only the claimer keeps a file, and renew the
   drain-start lock.
5. The default client (:mod:`wurk.push.client`): rebuilt on first use.
6. The event loop of ``async def`` jobs (:mod:`wurk.runtime.event_loop`): its
   thread stayed in the parent; the child's first async job starts one.
   Not imported here: ``import wurk`` stays free of asyncio.
   The writes Redis refused that a process keeps to send again
   (:mod:`wurk.wire.kept_writes`: released locks and limiter slots) are the
   parent's, not the child's.
7. Metrics (:mod:`wurk.observe.metrics`): fresh statsd sockets and totals,
   last, so nothing of the parent's is sent once Redis and the client are new.

``import wurk`` imports this module, so every process that can push gets it.
"""

from __future__ import annotations

import os
import sys

from wurk.core import threads
from wurk.observe import metrics
from wurk.push import buffered, client, confirmed, landing, spool, spool_drain
from wurk.redis import runtime
from wurk.wire import kept_writes


def forget_parent_state() -> None:
    """Run in the child after every fork (and callable again: each step is idempotent)."""
    threads.forget_after_fork()
    runtime.forget_after_fork()
    buffered.forget_after_fork()
    confirmed.forget_after_fork()
    landing.forget_after_fork()
    spool.forget_after_fork()
    spool_drain.forget_after_fork()
    client.forget_default_client()
    # Only a process that ran an async job has a loop (and imported asyncio for it).
    event_loop = sys.modules.get("wurk.runtime.event_loop")
    if event_loop is not None:
        event_loop.forget_after_fork()
    kept_writes.forget_after_fork()
    metrics.reset()


os.register_at_fork(after_in_child=forget_parent_state)
