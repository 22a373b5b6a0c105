from django.urls import path
from rest_framework.routers import SimpleRouter

from . import audit_views, views

router = SimpleRouter()
router.register("api-tokens", views.ApiTokenViewSet)
router.register("enrolment-tokens", views.EnrolmentTokenViewSet)
router.register("audit-events", audit_views.AuditEventViewSet)
urlpatterns = [path("me/", views.MeView.as_view(), name="me"), *router.urls]
