"""Report failed jobs to Sentry: one event when a job has failed for good.

Run it against a local Redis with ``SENTRY_DSN`` set (``python -m
examples.sentry_reporting``): the job fails, is not retried, and one event
reaches Sentry, tagged with the job's class, queue and jid, its card token
replaced by the scrubber. A real application calls ``sentry_sdk.init`` and
``instrument`` once, where it configures wurk (the module ``wurk run -r``
loads).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import sentry_sdk

import wurk
from wurk.contrib.sentry import instrument
from wurk.runtime.embedded import Embedded

reported = threading.Event()


@wurk.job(name="charge_card", retry=False)
def charge_card(order_id: int, card_token: str) -> None:
    sentry_sdk.add_breadcrumb(message=f"charging order {order_id}")
    raise RuntimeError(f"card declined for order {order_id}")


def keep_order_id(args: list[Any]) -> list[Any]:
    """What Sentry may see of the arguments: the order, never the card token."""
    return [args[0], "[Filtered]"] if args else []


def main(redis_url: str = "redis://localhost:6379/0", **sentry_options: Any) -> None:
    sentry_sdk.init(dsn=os.environ.get("SENTRY_DSN"),
                    before_send=lambda event, hint: (reported.set(), event)[1],
                    **sentry_options)
    config = wurk.configure(redis_url=redis_url, fetch_timeout=0.2)
    # "final": an event when the job dies or is dropped, none per retry.
    instrument(config, report="final", send_args=keep_order_id)
    worker = Embedded(config).start()
    try:
        charge_card.perform_async(1234, "tok_visa_4242")
        reported.wait(20)
    finally:
        worker.stop()
        sentry_sdk.flush()


if __name__ == "__main__":
    main()
