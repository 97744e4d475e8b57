"""ASGI entry point (uvicorn). ASGI, not WSGI, because the run page streams Server-Sent Events."""

import os
import sys
from pathlib import Path

_platform_dir = str(Path(__file__).resolve().parents[1])
if _platform_dir not in sys.path:
    sys.path.insert(0, _platform_dir)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "posttrain.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()
