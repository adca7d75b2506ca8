"""ASGI entry point of the Django Channels example, served by daphne at ws://127.0.0.1:8000/ws.

Run:  python -m lowlat_mw.servers.daphne -b 127.0.0.1 -p 8000 examples.django_project.asgi:application
      (daphne plus a handshake deadline and 1009 for oversized messages; docs/security.md "Transport")
Then: lowlat-mw chat ws://127.0.0.1:8000/ws "hello"
Metrics: curl http://127.0.0.1:8000/metrics  (Prometheus text: lowlat_* series; the view is in urls.py)
The scrape is unauthenticated: in production serve it where only Prometheus reaches (docs/observability.md).

AuthMiddlewareStack puts the logged-in user in scope["user"]; the model sees it as req.session.user.
lowlat-mw refuses cross-origin browsers itself (same host only unless LOWLAT_MW["allowed_origins"]).
To use Channels' AllowedHostsOriginValidator as well, wrap the router with it: note that it also
refuses clients that send no Origin header (such as the Python client, unless given origin=...).
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_project.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()  # set up Django before importing consumers

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from examples.django_project.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)
