"""An order, and the fulfilment a job writes for it."""

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    created = models.DateTimeField(auto_now_add=True)


class Fulfilment(models.Model):
    # One per order: a job delivered twice finds it there and does nothing.
    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    worker_pid = models.IntegerField()
