from rest_framework.routers import SimpleRouter

from .views import ForecastViewSet

router = SimpleRouter()
router.register("forecasts", ForecastViewSet)
urlpatterns = router.urls
