"""The Celery application: `celery -A workers.celery_app worker`."""

import os
import sys
from pathlib import Path

# platform/ is a source folder (never a package, so the standard `platform` module stays intact).
_platform_dir = str(Path(__file__).resolve().parents[1] / "platform")
if _platform_dir not in sys.path:
    sys.path.insert(0, _platform_dir)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "posttrain.settings")

from posttrain.core.task_queue import celery_app  # noqa: E402  (needs platform/ on sys.path first)

app = celery_app()
app.autodiscover_tasks(["workers"])
