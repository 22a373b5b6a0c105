from django.urls import path

from . import views

urlpatterns = [
    path("cache-map/", views.CacheMapView.as_view(), name="cache-map"),
    path("misses/", views.MissesView.as_view(), name="misses"),
    path("doctor/", views.DoctorView.as_view(), name="doctor"),
]
