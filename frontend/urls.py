"""Dashboard pages, sign in / out, and the page assets (our modules and the bundled Plotly.js)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from . import views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="frontend/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("ui/plotly.min.js", views.plotly_js, name="plotly-js"),
    path("ui/<path:path>", views.asset, name="asset"),
    path("", views.cache_map, name="home"),
    path("nodes/<int:pk>/", views.node_detail, name="node"),
    path("gpus/<int:pk>/", views.gpu_detail, name="gpu"),
    path("engines/<int:pk>/", views.engine_detail, name="engine"),
    path("forecasts/", views.forecasts, name="forecasts"),
    path("plans/", views.plans, name="plans"),
    path("plans/<int:pk>/", views.plan_detail, name="plan"),
    path("jobs/", views.jobs, name="jobs"),
    path("policies/", views.policies, name="policies"),
    path("overrides/", views.overrides, name="overrides"),
    path("scoreboard/", views.scoreboard, name="scoreboard"),
    path("misses/", views.misses, name="misses"),
    path("doctor/", views.doctor, name="doctor"),
    path("audit/", views.audit, name="audit"),
]
