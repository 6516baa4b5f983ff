"""Enqueue the example jobs: ``python -m examples.enqueue [N]``.

N (default 3) is the number of pretend sign-ups: each gets a welcome email
and a card charge. One report (which fails once, then succeeds on retry) and
one reminder scheduled two seconds ahead are added on top. Redis is found
through ``REDIS_URL`` (default ``redis://localhost:6379/0``).

The last line says how many executions the worker should count once all is
done (``stat:processed`` counts failed attempts too), for scripts to read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from examples.jobs import BuildReport, ChargeCard, send_reminder, send_welcome_email


def enqueue(signups: int) -> list[tuple[str, str]]:
    """Push every example job; returns (description, jid) pairs in push order."""
    pushed: list[tuple[str, str]] = []
    for user_id in range(1, signups + 1):
        address = f"user{user_id}@example.com"
        pushed.append((f"send_welcome_email({user_id}, {address!r})",
                       send_welcome_email.perform_async(user_id, address)))
        order_id = f"order-{user_id}"
        pushed.append((f"ChargeCard({order_id!r}, 1999) [critical]",
                       ChargeCard.perform_async(order_id, 1999)))
    pushed.append(("BuildReport('daily-signups') [fails once, then retries]",
                   BuildReport.perform_async("daily-signups")))
    pushed.append(("send_reminder(1, 'finish your profile') [in 2 s]",
                   send_reminder.perform_in(2, 1, "finish your profile")))
    return pushed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.enqueue", description=__doc__)
    parser.add_argument("signups", nargs="?", type=int, default=3,
                        help="pretend sign-ups to enqueue work for (default 3)")
    args = parser.parse_args(argv)
    if args.signups < 0:
        parser.error("signups must not be negative")
    pushed = enqueue(args.signups)
    for description, jid in pushed:
        print(f"pushed {jid}  {description}")
    failures = 1  # BuildReport's first attempt
    print(f"expected: jobs={len(pushed)} processed={len(pushed) + failures} failed={failures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
