"""A small shop's jobs and the code that pushes them, for the testing how-to.

The jobs keep what they did in memory (``SENT``, ``STOCK``): in your code
they would send mail or call an API. Nothing here needs Redis in a test.
"""

from __future__ import annotations

import wurk

SENT: list[str] = []
STOCK: dict[str, int] = {}


class MailServerDownError(ConnectionError):
    """The mail server did not answer; a retry later fixes it."""


def deliver(address: str, text: str) -> None:
    """Your mail client (a test replaces it to make it fail)."""
    SENT.append(address)


@wurk.job(queue="mail", retry=3)
def send_receipt(order_id: int, address: str) -> None:
    deliver(address, f"Thank you for order {order_id}")


@wurk.job(queue="orders")
def fulfil(order_id: int, skus: list[str]) -> None:
    for sku in skus:
        SyncStock.perform_async(sku)
    send_receipt.perform_async(order_id, f"order{order_id}@example.com")


class SyncStock(wurk.Job, queue="stock", retry=2, unique_for=60):
    def perform(self, sku: str) -> str:
        STOCK[sku] = STOCK.get(sku, 0) + 1
        return self.jid  # a unit test that calls perform() directly gets one too


def checkout(order_id: int, skus: list[str]) -> str | None:
    """What a web view would call: the order is fulfilled in the background."""
    return fulfil.perform_async(order_id, skus)
