"""The shapes of the code-only settings: hooks a Config holds as callables.

They are set in Python, never from TOML or the environment, and are typed
here, at the bottom of the layers, so the settings need nothing above them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

# Called with the exception and the job's payload when a job fails.
ErrorHandler = Callable[[BaseException, Mapping[str, Any]], None]
# Called with the payload and the last exception when a job goes to dead.
DeathHandler = Callable[[Mapping[str, Any], BaseException], None]
# mw(payload, queue, call_next): see wurk.runtime.middleware.
ServerMiddleware = Callable[[Mapping[str, Any], str, Callable[[], Any]], Any]
# mw(job_class, payload, queue, redis, call_next), ``redis`` being the client's
# RedisPool (typed Any here: settings sit below Redis access): see
# wurk.push.middleware.
ClientMiddleware = Callable[[str, dict[str, Any], str, Any, Callable[[], Any]], Any]
# Called with no arguments once a worker process has stopped and flushed its pushes.
ShutdownHook = Callable[[], None]


class RedisErrorHook(Protocol):
    """Told of every Redis retry, refusal and give-up of a pool."""

    def __call__(self, error: BaseException, *, attempt: int, action: str) -> None: ...
