"""What the steps write with a job's settlement: scripts sent together, retried until they land.

A step's ``concluding`` hook decides what an ending means for its own keys
and returns it as :class:`Write` objects (a Lua script, its keys and
arguments); it does no I/O. :func:`send` sends every step's writes of one
ending in one round trip (a pipeline of EVALSHA), before the job's
acknowledgement or settle, and sends again, with backoff, the ones Redis did
not take, until each has landed or been given up, or a hard stop took the
job (False: no ack, the job's copy stays for the recovery, which runs it
again: every write is safe to replay).

Each write says how a refusal is treated (:attr:`Write.refused`): a step
knows which of its errors waiting cures (an outage, a dropped connection)
and which it never will (a key of the wrong type, garbage in Redis), and
logs its own line. A script Redis lost (a restart, SCRIPT FLUSH) is loaded
and sent again at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wurk.redis.policy import SHORTEST_WAIT
from wurk.wire.kept_writes import evaluate

if TYPE_CHECKING:
    from wurk.core.backoff import Backoff
    from wurk.redis.pool import RedisPool
    from wurk.wire.lua import Script

# An attempt Redis refused: True to send the write again, False to give it up.
Refused = Callable[[Exception, int], bool]


@dataclass(frozen=True, slots=True, eq=False)
class Write:
    script: Script
    keys: Sequence[str]
    args: Sequence[Any]
    refused: Refused
    # The script's reply, once it landed.
    landed: Callable[[Any], None] | None = None

    def command(self) -> tuple[Any, ...]:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def send(pool: RedisPool, writes: Sequence[Write], abandoned: Callable[[float], bool],
         backoff: Backoff) -> bool:
    """Send ``writes`` until each landed or was given up (True), or a hard stop took the job."""
    pending = list(writes)
    attempt = 0
    while pending:
        attempt += 1
        replies = _round_trip(pool, pending)
        still: list[Write] = []
        for write, reply in zip(pending, replies, strict=True):
            if isinstance(reply, Exception):
                if write.refused(reply, attempt):
                    still.append(write)
            elif write.landed is not None:
                write.landed(reply)
        pending = still
        if pending and abandoned(max(SHORTEST_WAIT, backoff.delay(attempt))):
            return False
    return True


def _round_trip(pool: RedisPool, writes: list[Write]) -> list[Any]:
    try:
        return pool.run(lambda conn: evaluate(conn, writes), idempotent=True)
    except Exception as exc:  # noqa: BLE001 - the round trip failed as a whole: each write says
        return [exc] * len(writes)
