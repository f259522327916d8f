from __future__ import annotations

from django.urls import path

from tests.matrix.orders import views

urlpatterns = [path("orders/<str:key>/", views.place_order, name="place-order")]
