"""ASGI entry point (uvicorn). ASGI, not WSGI, because the run page streams Server-Sent Events.

Django's application is wrapped in RequestBodyBounds: Django reads every request's whole body before anything of
its own runs, so request bodies are capped, and refused without credentials, in front of it
(posttrain.core.request_bounds; docs/SECURITY.md, "Request bodies")."""

import os
import sys
from pathlib import Path

_platform_dir = str(Path(__file__).resolve().parents[1])
if _platform_dir not in sys.path:
    sys.path.insert(0, _platform_dir)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "posttrain.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_application = get_asgi_application()  # sets Django up: the middleware's imports need the apps loaded

from posttrain.core.request_bounds import RequestBodyBounds  # noqa: E402

application = RequestBodyBounds(django_application)
