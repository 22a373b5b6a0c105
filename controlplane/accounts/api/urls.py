from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("api-tokens", views.ApiTokenViewSet)
router.register("enrolment-tokens", views.EnrolmentTokenViewSet)
urlpatterns = [path("me/", views.MeView.as_view(), name="me"), *router.urls]
