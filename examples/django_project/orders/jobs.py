"""The orders app's jobs, found by wurk.contrib.django at start (no ``require``)."""

import os

import wurk
from orders.models import Fulfilment, Order


@wurk.job(queue="orders", retry=3)
def fulfil_order(order_id: int) -> None:
    """Write the order's fulfilment row; idempotent, as every job should be."""
    order = Order.objects.get(pk=order_id)
    Fulfilment.objects.get_or_create(order=order, defaults={"worker_pid": os.getpid()})
