"""Enqueue from async code: ``python -m examples.async_enqueue [N]``.

The async counterpart of ``examples.enqueue``: N pretend sign-ups (default
3), each pushed from its own coroutine, as concurrent request handlers
would, with the awaitable verbs; then one bulk push and one scheduled job.
Redis is found through ``REDIS_URL`` (default ``redis://localhost:6379/0``).
Prints each jid; the last line says how many jobs went in.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import wurk
from examples.jobs import ChargeCard, send_reminder, send_welcome_email


async def sign_up(user_id: int) -> list[str | None]:
    """What one request handler does: two pushes, awaited, the loop never blocked."""
    return [await send_welcome_email.aperform_async(user_id, f"user{user_id}@example.com"),
            await ChargeCard.aperform_async(f"order-{user_id}", 1999)]


async def enqueue(signups: int) -> list[str | None]:
    try:
        handlers = [sign_up(user_id) for user_id in range(1, signups + 1)]
        jids = [jid for pair in await asyncio.gather(*handlers) for jid in pair]
        jids += await send_welcome_email.aperform_bulk([(0, "a@example.com"),
                                                        (0, "b@example.com")])
        jids.append(await send_reminder.aperform_in(2, 1, "finish your profile"))
    finally:
        # Before the loop ends: flush the push buffer (spooling what Redis did not take).
        await wurk.AsyncClient.default().aclose()
    return jids


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.async_enqueue",
                                     description=__doc__)
    parser.add_argument("signups", nargs="?", type=int, default=3)
    args = parser.parse_args(argv)
    jids = asyncio.run(enqueue(max(0, args.signups)))
    for jid in jids:
        print(f"pushed {jid}")
    print(f"expected: jobs={len(jids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
