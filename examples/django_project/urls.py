"""HTTP routes: a health check and the Prometheus scrape of lowlat-mw's metrics."""

from __future__ import annotations

from django.http import HttpResponse
from django.urls import path

from lowlat_mw.adapters.channels import metrics_view

urlpatterns = [
    path("health", lambda request: HttpResponse("ok")),
    path("metrics", metrics_view),  # GET /metrics: lowlat_* series (daphne serves HTTP and WebSocket)
]
