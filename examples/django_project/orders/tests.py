"""The orders app's tests: ``python manage.py test orders``, with no Redis.

A ``TestCase`` runs each test in a transaction, so a push made in a view's
``transaction.atomic`` waits for a commit that never comes;
``captureOnCommitCallbacks(execute=True)`` runs it at the end of its block.
"""

from django.test import TestCase

import wurk.testing
from orders.jobs import fulfil_order
from orders.models import Fulfilment, Order


class PlaceOrderTests(TestCase):
    def test_the_push_waits_for_the_commit_then_the_job_runs(self) -> None:
        with wurk.testing.fake() as fake:
            with self.captureOnCommitCallbacks(execute=True):
                reply = self.client.post("/orders/tea/")
                self.assertEqual(fake.jobs, [])  # not before the commit

            [job] = fake.jobs_of(fulfil_order)
            self.assertEqual(job.jid, reply.json()["jid"])
            fake.drain()

        order = Order.objects.get(pk=reply.json()["order"])
        self.assertTrue(Fulfilment.objects.filter(order=order).exists())

    @wurk.testing.inline()
    def test_inline_runs_the_job_at_the_commit(self) -> None:
        with self.captureOnCommitCallbacks(execute=True):
            reply = self.client.post("/orders/cups/")
            self.assertFalse(Fulfilment.objects.exists())

        self.assertTrue(Fulfilment.objects.filter(order_id=reply.json()["order"]).exists())
