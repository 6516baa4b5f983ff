"""The benchmark's job: a no-op that counts itself.

``NoopJob`` does nothing but INCR ``bench:done``, as the peer benchmarks'
jobs do, so the harness can tell exactly when the last job finished (the
``stat:processed`` counter only moves when the heartbeat flushes, every few
seconds). It uses the worker's own Redis pool, built once per process.
"""

from __future__ import annotations

import wurk
from wurk.redis.runtime import runtime_for

DONE_KEY = "bench:done"


class NoopJob(wurk.Job, name="NoopJob"):
    def perform(self, *args: object) -> None:
        runtime_for(wurk.default_config()).pool.call("INCR", DONE_KEY)
