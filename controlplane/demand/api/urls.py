from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views

router = SimpleRouter()
router.register("workload-keys", views.WorkloadKeyViewSet)
router.register("miss-buckets", views.MissBucketViewSet)
router.register("history-imports", views.HistoryImportViewSet)
urlpatterns = [
    path("request-records/", views.RequestRecordsView.as_view(), name="request-records"),
    *router.urls,
]
