from django.contrib import admin
from django.urls import path

from demo_project.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/<int:order_id>/checkout/", views.checkout, name="checkout"),
    path("orders/<int:order_id>/gift-wrap/", views.gift_wrap, name="gift-wrap"),
]
