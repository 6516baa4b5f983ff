"""One view: ``POST /orders/<item>/`` creates an order and queues its fulfilment."""

from django.urls import path
from orders import views

urlpatterns = [path("orders/<str:item>/", views.place_order)]
