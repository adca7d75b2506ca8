"""WebSocket routes: the lowlat-mw consumer at /ws."""

from __future__ import annotations

import os

from django.urls import path

from lowlat_mw.adapters.channels import LowLatConsumer

websocket_urlpatterns = [
    path("ws", LowLatConsumer.as_asgi(model=os.environ.get("LOWLAT_MODEL") or "examples.django_project.ai.generate")),
]
