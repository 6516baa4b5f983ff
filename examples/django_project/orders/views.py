"""Enqueueing from a request: inside the transaction, the push waits for its commit."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from orders.jobs import fulfil_order
from orders.models import Order


@csrf_exempt
@require_POST
def place_order(request: HttpRequest, item: str) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(item=item)
        # Deferred to the commit (WURK_ON_COMMIT): the worker sees the order row.
        jid = fulfil_order.perform_async(order.pk)
    return JsonResponse({"order": order.pk, "jid": jid})
