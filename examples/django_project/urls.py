from __future__ import annotations

from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("health", lambda request: HttpResponse("ok"))]
